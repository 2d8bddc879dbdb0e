// Shard: which part of a global (unsharded) tensor a rank holds. Shared by the
// model (tensor-parallel parameters) and io (checkpoint hyperslabs).
#pragma once
#include <cstdint>
#include <vector>

namespace pipetrain {

// Which part of the global (unsharded) tensor a rank holds: the concatenation of
// `blocks` along dimension `dim` (e.g. a rank's heads of Q, K and V are three blocks
// of the fused QKV weight's rows). dim = -1: the whole tensor. A column shard (dim = 1)
// may also hold only some rows, the concatenation of `rows` (e.g. a tensor-parallel rank's
// columns of its expert-parallel rank's experts); empty: every row. Blocks are increasing.
struct Shard {
  struct Block {
    int64_t begin = 0, length = 0;
  };
  int dim = -1;
  std::vector<Block> blocks;
  std::vector<Block> rows = {};
  bool replicated() const { return dim < 0; }
};

// The local shape: the global shape with the held blocks' lengths summed.
std::vector<int64_t> local_shape(const std::vector<int64_t>& global_shape, const Shard& shard);

// The local shard of a global tensor (row-major, `global_shape`) described by `shard`.
std::vector<float> extract_shard(const std::vector<float>& global, const std::vector<int64_t>& global_shape,
                                 const Shard& shard);

}  // namespace pipetrain
