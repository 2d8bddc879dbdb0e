// h5io::Id, h5io::Quiet, h5io::last_error and the attribute readers (see
// pipetrain/io/h5io.hpp): the small HDF5 plumbing shared by the token files
// and the checkpoints.
#include <optional>
#include <string>

#include "pipetrain/core/error.hpp"

#include "pipetrain/io/h5io.hpp"

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

std::optional<int64_t> read_int_attr(hid_t obj, const char* name, const std::string& path) {
  if (H5Aexists(obj, name) <= 0) return std::nullopt;
  Id attr(H5Aopen(obj, name, H5P_DEFAULT));
  if (!attr.valid()) fail("{}: cannot open attribute {} ({})", path, name, h5io::last_error());
  Id type(H5Aget_type(attr.get()));
  Id space(H5Aget_space(attr.get()));
  if (H5Tget_class(type.get()) != H5T_INTEGER || H5Sget_simple_extent_npoints(space.get()) != 1)
    fail("{}: attribute {} must be one integer", path, name);
  int64_t v = 0;
  if (H5Aread(attr.get(), H5T_NATIVE_INT64, &v) < 0)
    fail("{}: cannot read attribute {} ({})", path, name, h5io::last_error());
  return v;
}

std::optional<std::string> read_string_attr(hid_t obj, const char* name, const std::string& path) {
  if (H5Aexists(obj, name) <= 0) return std::nullopt;
  Id attr(H5Aopen(obj, name, H5P_DEFAULT));
  if (!attr.valid()) fail("{}: cannot open attribute {} ({})", path, name, h5io::last_error());
  Id type(H5Aget_type(attr.get()));
  Id space(H5Aget_space(attr.get()));
  if (H5Tget_class(type.get()) != H5T_STRING || H5Sget_simple_extent_npoints(space.get()) != 1)
    fail("{}: attribute {} must be one string", path, name);
  std::string out;
  if (H5Tis_variable_str(type.get()) > 0) {
    Id mem(H5Tcopy(H5T_C_S1));
    H5Tset_size(mem.get(), H5T_VARIABLE);
    H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
    char* s = nullptr;
    if (H5Aread(attr.get(), mem.get(), &s) < 0)
      fail("{}: cannot read attribute {} ({})", path, name, h5io::last_error());
    if (s) out = s;
    H5free_memory(s);
  } else {
    std::string buf(H5Tget_size(type.get()), '\0');
    if (H5Aread(attr.get(), type.get(), buf.data()) < 0)
      fail("{}: cannot read attribute {} ({})", path, name, h5io::last_error());
    out = buf.substr(0, buf.find('\0'));
    while (!out.empty() && out.back() == ' ') out.pop_back();  // space-padded strings
  }
  return out;
}

bool parallel_hdf5() {
#ifdef H5_HAVE_PARALLEL
  return true;
#else
  return false;
#endif
}

Id mpio_fapl(MPI_Comm comm, const std::string& what) {
  Id fapl(H5Pcreate(H5P_FILE_ACCESS));
  if (!fapl.valid()) fail("{}: file access list: {}", what, last_error());
#ifdef H5_HAVE_PARALLEL
  if (H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL) < 0) fail("{}: MPI-IO file driver: {}", what, last_error());
#else
  int ranks = 1;
  MPI_Comm_size(comm, &ranks);
  if (ranks > 1)
    fail("{}: {} ranks share this file, but pipetrain was built with a serial HDF5 ({}); rebuild against a "
         "parallel HDF5 (e.g. Debian's libhdf5-openmpi-dev, or the site's hdf5 module built with MPI), or run "
         "on one rank",
         what, ranks, H5_VERS_INFO);
#endif
  return fapl;
}

Id transfer_list(Transfer mode) {
  Id dxpl(H5Pcreate(H5P_DATASET_XFER));
  if (!dxpl.valid()) fail("transfer list: {}", last_error());
#ifdef H5_HAVE_PARALLEL
  if (H5Pset_dxpl_mpio(dxpl.get(), mode == Transfer::Collective ? H5FD_MPIO_COLLECTIVE : H5FD_MPIO_INDEPENDENT) < 0)
    fail("MPI-IO transfer mode: {}", last_error());
#else
  (void)mode;  // one rank: the default transfer
#endif
  return dxpl;
}

}  // namespace pipetrain::h5io
