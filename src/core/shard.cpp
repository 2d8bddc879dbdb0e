#include "pipetrain/core/shard.hpp"

namespace pipetrain {

std::vector<float> extract_shard(const std::vector<float>& global, const std::vector<int64_t>& gshape,
                                 const Shard& shard) {
  if (shard.replicated()) return global;
  const int64_t rows = gshape[0];
  const int64_t cols = static_cast<int64_t>(global.size()) / rows;
  std::vector<float> out;
  if (shard.dim == 0) {
    for (const auto& b : shard.blocks)
      out.insert(out.end(), global.begin() + b.begin * cols, global.begin() + (b.begin + b.length) * cols);
  } else {
    for (int64_t r = 0; r < rows; ++r)
      for (const auto& b : shard.blocks)
        out.insert(out.end(), global.begin() + r * cols + b.begin, global.begin() + r * cols + b.begin + b.length);
  }
  return out;
}

}  // namespace pipetrain
