// h5io::Id, h5io::Quiet and h5io::last_error (see pipetrain/io/token_dataset.hpp):
// the small HDF5 plumbing shared by the token-file reader and writer.
#include <string>

#include "pipetrain/io/token_dataset.hpp"

namespace pipetrain::h5io {

Id& Id::operator=(Id&& o) noexcept {
  if (this != &o) {
    reset();
    id_ = o.id_;
    o.id_ = H5I_INVALID_HID;
  }
  return *this;
}

bool Id::reset() {
  if (id_ < 0) return true;
  herr_t rc = -1;
  switch (H5Iget_type(id_)) {
    case H5I_FILE:
      rc = H5Fclose(id_);
      break;
    case H5I_GROUP:
      rc = H5Gclose(id_);
      break;
    case H5I_DATASET:
      rc = H5Dclose(id_);
      break;
    case H5I_DATASPACE:
      rc = H5Sclose(id_);
      break;
    case H5I_DATATYPE:
      rc = H5Tclose(id_);
      break;
    case H5I_ATTR:
      rc = H5Aclose(id_);
      break;
    case H5I_GENPROP_LST:
      rc = H5Pclose(id_);
      break;
    default:
      rc = H5Idec_ref(id_) < 0 ? -1 : 0;
      break;
  }
  id_ = H5I_INVALID_HID;
  return rc >= 0;
}

Quiet::Quiet() {
  H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

Quiet::~Quiet() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }

namespace {

herr_t take_first(unsigned /*n*/, const H5E_error2_t* err, void* out) {
  auto* s = static_cast<std::string*>(out);
  if (s->empty() && err && err->desc && err->desc[0]) *s = err->desc;
  return 0;
}

}  // namespace

std::string last_error() {
  std::string msg;
  // Upward: the most specific (innermost) entry comes first.
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, take_first, &msg);
  H5Eclear2(H5E_DEFAULT);
  return msg;
}

}  // namespace pipetrain::h5io
