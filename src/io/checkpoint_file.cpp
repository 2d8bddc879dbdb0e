// Writing and reading checkpoint files (see pipetrain/io/checkpoint.hpp).
#include <hdf5.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fmt/ranges.h>

#include "pipetrain/core/error.hpp"
#include "pipetrain/core/fault.hpp"
#include "pipetrain/io/checkpoint.hpp"
#include "pipetrain/io/durable_file.hpp"
#include "pipetrain/io/h5io.hpp"

namespace pipetrain {

namespace {

using h5io::Id;

Id checked(hid_t id, const std::string& what) {
  if (id < 0) fail("{}: {}", what, h5io::last_error());
  return Id(id);
}

void check(herr_t rc, const std::string& what) {
  if (rc < 0) fail("{}: {}", what, h5io::last_error());
}

// Writes of filtered (checksummed) datasets must be collective in parallel HDF5; reads
// need not be, and independent reads let each rank fetch and verify only its chunks.
using h5io::mpio_fapl;
using h5io::transfer_list;

template <typename T>
void write_attr(hid_t obj, const char* name, hid_t type, const T& value) {
  Id space = checked(H5Screate(H5S_SCALAR), name);
  Id attr = checked(H5Acreate2(obj, name, type, space.get(), H5P_DEFAULT, H5P_DEFAULT), name);
  check(H5Awrite(attr.get(), type, &value), name);
}

void write_string_attr(hid_t obj, const char* name, const std::string& value) {
  Id type = checked(H5Tcopy(H5T_C_S1), name);
  H5Tset_size(type.get(), std::max<size_t>(1, value.size()));
  H5Tset_strpad(type.get(), H5T_STR_NULLPAD);
  Id space = checked(H5Screate(H5S_SCALAR), name);
  Id attr = checked(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), name);
  std::string padded = value.empty() ? std::string(1, '\0') : value;
  check(H5Awrite(attr.get(), type.get(), padded.data()), name);
}

// A root attribute the checkpoint must have: exactly one integer.
template <typename T>
T read_attr(hid_t obj, const char* name, hid_t type, const std::string& file) {
  if (H5Aexists(obj, name) <= 0) fail("{}: not a pipetrain checkpoint (no attribute {})", file, name);
  Id attr = checked(H5Aopen(obj, name, H5P_DEFAULT), file);
  Id ftype = checked(H5Aget_type(attr.get()), file);
  Id space = checked(H5Aget_space(attr.get()), file);
  if (H5Tget_class(ftype.get()) != H5T_INTEGER || H5Sget_simple_extent_npoints(space.get()) != 1)
    fail("{}: attribute {} must be one integer", file, name);
  T v{};
  check(H5Aread(attr.get(), type, &v), file);
  return v;
}

// The grid's attributes: every dimension of GridShape. Files written before cp and ep were
// recorded lack those two (optional: read as 1).
struct GridAttribute {
  const char* name;
  int GridShape::*dim;
  bool required;
};
constexpr GridAttribute kGridAttributes[] = {{"grid_dp", &GridShape::dp, true},
                                             {"grid_pp", &GridShape::pp, true},
                                             {"grid_tp", &GridShape::tp, true},
                                             {"grid_cp", &GridShape::cp, false},
                                             {"grid_ep", &GridShape::ep, false}};

std::string read_string_attr(hid_t obj, const char* name, const std::string& file) {
  auto s = h5io::read_string_attr(obj, name, file);
  if (!s) fail("{}: not a pipetrain checkpoint (no attribute {})", file, name);
  return *s;
}

// Calls piece(global_begin, count) for the parts of the local range [x0, x1) along one
// dimension that fall in each of `blocks` (held in order, concatenated locally).
template <typename F>
void for_each_block_piece(const std::vector<Shard::Block>& blocks, hsize_t x0, hsize_t x1, F&& piece) {
  hsize_t offset = 0;  // where the block starts in the local layout
  for (const auto& b : blocks) {
    const hsize_t b0 = offset, b1 = offset + static_cast<hsize_t>(b.length);
    offset = b1;
    const hsize_t s0 = std::max(x0, b0), s1 = std::min(x1, b1);
    if (s0 < s1) piece(static_cast<hsize_t>(b.begin) + (s0 - b0), s1 - s0);
  }
}

// Adds the global hyperslab of the local box [lo, lo + n) (per dimension) to the
// selection, splitting it at the shard's block boundaries along the shard dimension (and
// along the rows, for a column shard holding some rows only).
void select_local_box(hid_t space, const Shard& shard, std::vector<hsize_t> lo, std::vector<hsize_t> n) {
  auto add = [&](const std::vector<hsize_t>& start, const std::vector<hsize_t>& count) {
    H5Sselect_hyperslab(space, H5S_SELECT_OR, start.data(), nullptr, count.data(), nullptr);
  };
  if (shard.replicated()) return add(lo, n);
  const size_t d = static_cast<size_t>(shard.dim);
  for_each_block_piece(shard.blocks, lo[d], lo[d] + n[d], [&](hsize_t begin, hsize_t count) {
    std::vector<hsize_t> start = lo, counts = n;
    start[d] = begin;
    counts[d] = count;
    if (shard.rows.empty()) return add(start, counts);
    for_each_block_piece(shard.rows, lo[0], lo[0] + n[0], [&](hsize_t row, hsize_t rows) {
      start[0] = row;
      counts[0] = rows;
      add(start, counts);
    });
  });
}

// Calls box(lo, n) for the boxes that make up the elements [a, b) of a row-major 1-D or
// 2-D array `dims`: at most three (the rest of the first row, whole rows, the start of
// the last row).
template <typename F>
void for_each_flat_box(const std::vector<int64_t>& dims, int64_t a, int64_t b, F&& box) {
  if (a >= b) return;
  if (dims.size() == 1) return box({static_cast<hsize_t>(a)}, {static_cast<hsize_t>(b - a)});
  if (dims.size() != 2) fail("checkpoint: ZeRO-1 slices of {}-D tensors are not supported", dims.size());
  const int64_t C = dims[1];
  auto rows = [&](int64_t row, int64_t count, int64_t col, int64_t cols) {
    if (count > 0 && cols > 0)
      box({static_cast<hsize_t>(row), static_cast<hsize_t>(col)},
          {static_cast<hsize_t>(count), static_cast<hsize_t>(cols)});
  };
  int64_t r0 = a / C;
  const int64_t c0 = a % C, r1 = b / C, c1 = b % C;
  if (r0 == r1) return rows(r0, 1, c0, c1 - c0);
  if (c0 > 0) rows(r0++, 1, c0, C - c0);
  rows(r0, r1 - r0, 0, C);
  rows(r1, 1, 0, c1);
}

// Selects the elements [a, b) of the local shard in the file. The local -> global map is
// increasing along every dimension, so HDF5's row-major walk of the file selection
// meets the elements in the order of the memory selection (the same boxes, locally).
void select_flat_range(hid_t space, const std::vector<int64_t>& gshape, const Shard& shard, int64_t a, int64_t b) {
  H5Sselect_none(space);
  for_each_flat_box(local_shape(gshape, shard), a, b, [&](std::vector<hsize_t> lo, std::vector<hsize_t> n) {
    select_local_box(space, shard, std::move(lo), std::move(n));
  });
}

// The file selection of this rank's part of a tensor (or nothing): its whole local
// shard, or the run of elements of a partial one.
void select_part(hid_t space, const CheckpointTensor& t, bool take) {
  H5Sselect_none(space);
  if (!take) return;
  if (t.partial()) return select_flat_range(space, t.global_shape, t.shard, t.flat_begin, t.flat_end);
  if (t.shard.replicated()) {
    H5Sselect_all(space);
    return;
  }
  const auto dims = local_shape(t.global_shape, t.shard);
  select_local_box(space, t.shard, std::vector<hsize_t>(dims.size(), 0), std::vector<hsize_t>(dims.begin(), dims.end()));
}

// The local buffer, shaped like the shard (so HDF5 maps matching shapes quickly); for a
// partial tensor the same boxes as in the file, selected in the shard's shape.
Id memory_space(hid_t file_space, const CheckpointTensor& t) {
  const hssize_t n = H5Sget_select_npoints(file_space);
  const auto local = local_shape(t.global_shape, t.shard);
  std::vector<hsize_t> dims(local.begin(), local.end());
  if (t.partial()) {
    Id mem = checked(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), "memory space");
    H5Sselect_none(mem.get());
    if (n > 0)
      for_each_flat_box(local, t.flat_begin, t.flat_end, [&](std::vector<hsize_t> lo, std::vector<hsize_t> cnt) {
        H5Sselect_hyperslab(mem.get(), H5S_SELECT_OR, lo.data(), nullptr, cnt.data(), nullptr);
      });
    return mem;
  }
  Id mem = checked(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), "memory space");
  if (n == 0) H5Sselect_none(mem.get());
  return mem;
}

// The address HDF5 takes as the start of the local shard. A partial tensor's data holds
// only elements [flat_begin, flat_end), so this is flat_begin elements before it; HDF5
// touches only the selected elements, all inside the buffer.
void* buffer_of(const CheckpointTensor& t) {
  if (!t.partial() || !t.data) return t.data;
  return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(t.data) -
                                 static_cast<uintptr_t>(t.flat_begin) * sizeof(float));
}

// Chunks of at most ~4M elements (16 MiB), whole rows where possible.
std::vector<hsize_t> chunk_dims(const std::vector<int64_t>& gshape) {
  std::vector<hsize_t> c(gshape.begin(), gshape.end());
  int64_t row = 1;
  for (size_t i = 1; i < gshape.size(); ++i) row *= gshape[i];
  const int64_t rows = std::max<int64_t>(1, std::min<int64_t>(gshape[0], (4 << 20) / std::max<int64_t>(row, 1)));
  c[0] = static_cast<hsize_t>(rows);
  return c;
}

// The collective write of the whole file under the temporary name `tmp`.
void write_file(const std::string& tmp, const std::string& path, MPI_Comm comm, const CheckpointMeta& meta,
                const std::vector<CheckpointTensor>& tensors) {
  Id fapl = mpio_fapl(comm, path);
  Id file = checked(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), tmp + ": cannot create");
  const hid_t root = file.get();
  write_attr(root, "format_version", H5T_NATIVE_INT, meta.format_version);
  write_attr(root, "step", H5T_NATIVE_INT64, meta.step);
  write_attr(root, "tokens_seen", H5T_NATIVE_INT64, meta.tokens_seen);
  write_attr(root, "samples_seen", H5T_NATIVE_INT64, meta.samples_seen);
  write_attr(root, "seed", H5T_NATIVE_UINT64, meta.seed);
  for (const auto& a : kGridAttributes) write_attr(root, a.name, H5T_NATIVE_INT, meta.grid.*a.dim);
  write_attr(root, "zero1", H5T_NATIVE_INT, static_cast<int>(meta.zero1));
  write_string_attr(root, "schedule", meta.schedule);
  if (!meta.tokenizer.empty()) write_string_attr(root, "tokenizer", meta.tokenizer);
  write_string_attr(root, "config", meta.config_toml);

  Id lcpl = checked(H5Pcreate(H5P_LINK_CREATE), "link list");
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  Id dxpl = transfer_list(h5io::Transfer::Collective);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    fault::point("checkpoint-write");
    std::vector<hsize_t> dims(t.global_shape.begin(), t.global_shape.end());
    Id space = checked(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), t.name);
    Id dcpl = checked(H5Pcreate(H5P_DATASET_CREATE), t.name);
    const auto chunk = chunk_dims(t.global_shape);
    check(H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()), t.name);
    check(H5Pset_fletcher32(dcpl.get()), t.name);
    // Every element is written: no fill values (parallel HDF5 would write them first).
    check(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), t.name);
    Id dset = checked(H5Dcreate2(root, t.name.c_str(), H5T_IEEE_F32LE, space.get(), lcpl.get(), dcpl.get(),
                                 H5P_DEFAULT),
                      tmp + ": " + t.name);
    select_part(space.get(), t, t.write && t.data);
    Id mem = memory_space(space.get(), t);
    check(H5Dwrite(dset.get(), H5T_NATIVE_FLOAT, mem.get(), space.get(), dxpl.get(), buffer_of(t)),
          tmp + ": writing " + t.name);
  }
  check(H5Fflush(root, H5F_SCOPE_GLOBAL), tmp + ": flush");
  if (!file.reset()) fail("{}: closing the file failed", tmp);
}

}  // namespace

void write_checkpoint(const std::string& path, MPI_Comm comm, const CheckpointMeta& meta,
                      const std::vector<CheckpointTensor>& tensors) {
  h5io::Quiet quiet;
  int rank = 0, ranks = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &ranks);
  const std::string tmp = path + ".tmp";
  if (ranks > 1) {
    write_file(tmp, path, comm, meta, tensors);  // an error here ends the job (fail_fast.hpp)
  } else {
    // One rank unwinds its errors: leave no partial file behind.
    try {
      write_file(tmp, path, comm, meta, tensors);
    } catch (...) {
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      throw;
    }
  }
  // Every writer syncs what it wrote (on a parallel file system each client caches its
  // own writes); only then is the complete file published under its name.
  sync_file(tmp);
  MPI_Barrier(comm);
  if (rank == 0) publish(tmp, path);
  MPI_Barrier(comm);
}

namespace {
CheckpointMeta read_meta(const std::string& path);
}  // namespace

CheckpointMeta read_checkpoint_meta(const std::string& path) {
  h5io::Quiet quiet;
  try {
    return read_meta(path);
  } catch (const CheckpointUnreadable&) {
    throw;
  } catch (const Error& e) {
    throw CheckpointUnreadable(e.what());
  }
}

namespace {
CheckpointMeta read_meta(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail("{}: no such checkpoint file", path);
  if (H5Fis_hdf5(path.c_str()) <= 0) fail("{}: not an HDF5 file", path);
  Id file = checked(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), path + ": cannot open");
  CheckpointMeta m;
  m.format_version = read_attr<int>(file.get(), "format_version", H5T_NATIVE_INT, path);
  if (m.format_version != kCheckpointFormatVersion)
    fail("{}: checkpoint format version {} is not supported (this build reads {})", path, m.format_version,
         kCheckpointFormatVersion);
  m.step = read_attr<int64_t>(file.get(), "step", H5T_NATIVE_INT64, path);
  m.tokens_seen = read_attr<int64_t>(file.get(), "tokens_seen", H5T_NATIVE_INT64, path);
  m.samples_seen = read_attr<int64_t>(file.get(), "samples_seen", H5T_NATIVE_INT64, path);
  m.seed = read_attr<uint64_t>(file.get(), "seed", H5T_NATIVE_UINT64, path);
  for (const auto& a : kGridAttributes)
    if (a.required || H5Aexists(file.get(), a.name) > 0)
      m.grid.*a.dim = read_attr<int>(file.get(), a.name, H5T_NATIVE_INT, path);
  m.zero1 = read_attr<int>(file.get(), "zero1", H5T_NATIVE_INT, path) != 0;
  m.schedule = read_string_attr(file.get(), "schedule", path);
  m.config_toml = read_string_attr(file.get(), "config", path);
  if (H5Aexists(file.get(), "tokenizer") > 0) m.tokenizer = read_string_attr(file.get(), "tokenizer", path);
  const GridShape& g = m.grid;
  if (m.step < 0 || m.tokens_seen < 0 || m.samples_seen < 0 || g.dp < 1 || g.pp < 1 || g.tp < 1 || g.cp < 1 ||
      g.ep < 1 || g.dp % g.ep)
    fail("{}: damaged metadata (step {}, samples {}, tokens {}, grid {})", path, m.step, m.samples_seen, m.tokens_seen,
         g.text());
  return m;
}
}  // namespace

void read_checkpoint_tensors(const std::string& path, MPI_Comm comm, const std::vector<CheckpointTensor>& tensors) {
  h5io::Quiet quiet;
  // Serial HDF5: every rank reads the file by itself (reading needs no shared driver).
  Id fapl = h5io::parallel_hdf5() ? mpio_fapl(comm, path) : Id(H5Pcreate(H5P_FILE_ACCESS));
  const hid_t opened = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get());
  if (opened < 0) throw CheckpointUnreadable(fmt::format("{}: cannot open: {}", path, h5io::last_error()));
  Id file(opened);
  Id dxpl = transfer_list(h5io::Transfer::Independent);
  for (const auto& t : tensors) {
    if (H5Lexists(file.get(), t.name.c_str(), H5P_DEFAULT) <= 0)
      fail("{}: no dataset {} (a checkpoint of another model?)", path, t.name);
    Id dset = checked(H5Dopen2(file.get(), t.name.c_str(), H5P_DEFAULT), path + ": " + t.name);
    Id space = checked(H5Dget_space(dset.get()), t.name);
    std::vector<hsize_t> dims(static_cast<size_t>(H5Sget_simple_extent_ndims(space.get())));
    H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    if (std::vector<int64_t>(dims.begin(), dims.end()) != t.global_shape) {
      const std::string got = fmt::format("{}", fmt::join(dims, "x"));
      const std::string want = fmt::format("{}", fmt::join(t.global_shape, "x"));
      fail("{}: {} has shape {} but the model needs {} (model config differs from the checkpoint's)", path,
           t.name, got, want);
    }
    if (!t.data) continue;  // independent reads: ranks without this tensor skip it
    select_part(space.get(), t, true);
    Id mem = memory_space(space.get(), t);
    if (H5Dread(dset.get(), H5T_NATIVE_FLOAT, mem.get(), space.get(), dxpl.get(), buffer_of(t)) < 0)
      throw CheckpointUnreadable(fmt::format("{}: reading {} failed (checksum mismatch or I/O error): {}", path,
                                             t.name, h5io::last_error()));
  }
}

}  // namespace pipetrain
