// h5io: the small HDF5 plumbing shared by the token files and the checkpoints — RAII
// for HDF5 ids, a scoped silencer of HDF5's own error printing, the last error message,
// and strict readers of one-integer / one-string attributes.
#pragma once
#include <hdf5.h>
#include <mpi.h>

#include <cstdint>
#include <optional>
#include <string>

namespace pipetrain {

namespace h5io {

// Owns one HDF5 id (file, dataset, dataspace, datatype, attribute, property list,
// group) and closes it with the matching H5*close. Move-only.
class Id {
 public:
  Id() = default;
  explicit Id(hid_t id) : id_(id) {}
  ~Id() { reset(); }
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  Id(Id&& o) noexcept : id_(o.id_) { o.id_ = H5I_INVALID_HID; }
  Id& operator=(Id&& o) noexcept;
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Closes now; returns false if HDF5 reported an error while closing.
  bool reset();

 private:
  hid_t id_ = H5I_INVALID_HID;
};

// While alive, HDF5 does not print its error stack (our messages replace it).
class Quiet {
 public:
  Quiet();
  ~Quiet();
  Quiet(const Quiet&) = delete;
  Quiet& operator=(const Quiet&) = delete;

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

// The most specific message on HDF5's error stack ("" if none); clears the stack.
std::string last_error();

// Attribute `name` of `obj`: nullopt when absent; pipetrain::Error naming `path` when it
// is not exactly one integer (one string: fixed- or variable-length).
std::optional<int64_t> read_int_attr(hid_t obj, const char* name, const std::string& path);
std::optional<std::string> read_string_attr(hid_t obj, const char* name, const std::string& path);

// A file shared by the ranks of `comm`: with parallel HDF5, a file access list on the
// MPI-IO driver over `comm`, and a transfer list (collective or independent). With a
// serial HDF5 (H5_HAVE_PARALLEL unset), one rank gets the default driver and lists, and
// more than one a pipetrain::Error naming `what` (no rank could share the file). Throw
// pipetrain::Error on failure.
enum class Transfer { Collective, Independent };
Id mpio_fapl(MPI_Comm comm, const std::string& what);
Id transfer_list(Transfer mode);
// Whether this build's HDF5 can share one file between ranks (parallel HDF5).
bool parallel_hdf5();

}  // namespace h5io

}  // namespace pipetrain
