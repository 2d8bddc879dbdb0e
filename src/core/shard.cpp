#include "pipetrain/core/shard.hpp"

#include <cstddef>

namespace pipetrain {

namespace {

int64_t total(const std::vector<Shard::Block>& blocks) {
  int64_t n = 0;
  for (const auto& b : blocks) n += b.length;
  return n;
}

}  // namespace

std::vector<int64_t> local_shape(const std::vector<int64_t>& global_shape, const Shard& shard) {
  std::vector<int64_t> dims = global_shape;
  if (shard.replicated()) return dims;
  dims[static_cast<size_t>(shard.dim)] = total(shard.blocks);
  if (!shard.rows.empty()) dims[0] = total(shard.rows);
  return dims;
}

std::vector<float> extract_shard(const std::vector<float>& global, const std::vector<int64_t>& gshape,
                                 const Shard& shard) {
  if (shard.replicated()) return global;
  const int64_t rows = gshape[0];
  const int64_t cols = static_cast<int64_t>(global.size()) / rows;
  std::vector<float> out;
  if (shard.dim == 0) {
    for (const auto& b : shard.blocks)
      out.insert(out.end(), global.begin() + b.begin * cols, global.begin() + (b.begin + b.length) * cols);
    return out;
  }
  const std::vector<Shard::Block> held = shard.rows.empty() ? std::vector<Shard::Block>{{0, rows}} : shard.rows;
  for (const auto& rb : held)
    for (int64_t r = rb.begin; r < rb.begin + rb.length; ++r)
      for (const auto& b : shard.blocks)
        out.insert(out.end(), global.begin() + r * cols + b.begin, global.begin() + r * cols + b.begin + b.length);
  return out;
}

}  // namespace pipetrain
