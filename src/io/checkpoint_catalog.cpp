// Listing, verifying, naming and pruning checkpoint files (see pipetrain/io/checkpoint.hpp).
#include <hdf5.h>

#include <algorithm>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <regex>

#include "pipetrain/core/error.hpp"
#include "pipetrain/io/checkpoint.hpp"
#include "pipetrain/io/durable_file.hpp"
#include "pipetrain/io/h5io.hpp"

namespace pipetrain {

namespace fs = std::filesystem;

namespace {

// Every dataset under `group` (recursively), with its path and shape. Uses only calls
// whose signatures are the same in HDF5 1.10, 1.12 and 1.14. A checkpoint nests two
// groups deep; a link back to an ancestor (a cycle) stops at the depth limit.
constexpr int kMaxDepth = 16;
void walk(hid_t group, const std::string& prefix, std::vector<CheckpointEntry>& out, int depth = 0) {
  if (depth > kMaxDepth) fail("/{}: groups nested more than {} deep (a link cycle?): not a pipetrain checkpoint", prefix, kMaxDepth);
  H5G_info_t info{};
  if (H5Gget_info(group, &info) < 0) return;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t len = H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (len < 0) continue;
    std::string name(static_cast<size_t>(len) + 1, '\0');
    H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size(), H5P_DEFAULT);
    name.resize(static_cast<size_t>(len));
    h5io::Id obj(H5Oopen(group, name.c_str(), H5P_DEFAULT));
    if (!obj.valid()) continue;
    const std::string path = prefix.empty() ? name : prefix + "/" + name;
    if (H5Iget_type(obj.get()) == H5I_GROUP) {
      walk(obj.get(), path, out, depth + 1);
    } else if (H5Iget_type(obj.get()) == H5I_DATASET) {
      h5io::Id space(H5Dget_space(obj.get()));
      std::vector<hsize_t> dims(static_cast<size_t>(std::max(0, H5Sget_simple_extent_ndims(space.get()))));
      H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
      out.push_back({path, std::vector<int64_t>(dims.begin(), dims.end())});
    }
  }
}

h5io::Id open_plain(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) fail("{}: no such checkpoint file", path);
  if (H5Fis_hdf5(path.c_str()) <= 0) fail("{}: not an HDF5 file", path);
  h5io::Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!file.valid()) fail("{}: cannot open: {}", path, h5io::last_error());
  return file;
}

}  // namespace

std::vector<CheckpointEntry> list_checkpoint(const std::string& path) {
  h5io::Quiet quiet;
  h5io::Id file = open_plain(path);
  std::vector<CheckpointEntry> entries;
  walk(file.get(), "", entries);
  return entries;
}

std::vector<std::string> verify_checkpoint(const std::string& path) {
  h5io::Quiet quiet;
  (void)read_checkpoint_meta(path);
  h5io::Id file = open_plain(path);
  std::vector<CheckpointEntry> entries;
  walk(file.get(), "", entries);
  std::vector<std::string> bad;
  std::vector<float> buf;
  for (const auto& e : entries) {
    int64_t n = 1;
    for (auto d : e.shape) n *= d;
    buf.resize(static_cast<size_t>(std::max<int64_t>(n, 1)));
    h5io::Id dset(H5Dopen2(file.get(), e.name.c_str(), H5P_DEFAULT));
    if (!dset.valid() || H5Dread(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) < 0)
      bad.push_back(e.name);
  }
  return bad;
}

std::string checkpoint_path(const std::string& dir, int64_t step) {
  return (fs::path(dir) / fmt::format("step_{:08d}.h5", step)).string();
}

std::vector<std::string> checkpoints_in(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  static const std::regex pattern(R"(step_\d{8}\.h5)");
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file() && std::regex_match(e.path().filename().string(), pattern))
      out.push_back(e.path().string());
  std::sort(out.rbegin(), out.rend());  // zero-padded step numbers sort by name
  return out;
}

void update_latest(const std::string& dir, const std::string& file) {
  write_durably((fs::path(dir) / "latest").string(),
                [&](std::ostream& out) { out << fs::path(file).filename().string() << '\n'; });
}

void prune_checkpoints(const std::string& dir, int keep) {
  const auto all = checkpoints_in(dir);
  std::error_code ec;
  for (size_t i = static_cast<size_t>(std::max(keep, 0)); i < all.size(); ++i) fs::remove(all[i], ec);
}

}  // namespace pipetrain
