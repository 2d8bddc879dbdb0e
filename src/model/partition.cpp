#include "pipetrain/model/partition.hpp"

#include "pipetrain/core/error.hpp"

namespace pipetrain {

std::vector<StageUnits> partition_gpt2(const ModelConfig& model, int num_stages,
                                       const std::vector<int>& layers_per_stage) {
  const int L = model.n_layer;
  if (num_stages < 1) fail("need at least one pipeline stage, got {}", num_stages);
  std::vector<int> blocks = layers_per_stage;
  if (blocks.empty()) {
    if (num_stages > L)
      fail("{} pipeline stages but only model.n_layer = {} blocks to split", num_stages, L);
    for (int s = 0; s < num_stages; ++s) blocks.push_back(L / num_stages + (s < L % num_stages ? 1 : 0));
  }
  if (static_cast<int>(blocks.size()) != num_stages)
    fail("parallel.layers_per_stage has {} entries for {} stages", blocks.size(), num_stages);
  std::vector<StageUnits> out(static_cast<size_t>(num_stages));
  int unit = 1;  // first block
  for (int s = 0; s < num_stages; ++s) {
    out[static_cast<size_t>(s)].first = s == 0 ? 0 : unit;
    unit += blocks[static_cast<size_t>(s)];
    out[static_cast<size_t>(s)].last = s == num_stages - 1 ? L + 2 : unit;
  }
  if (unit != L + 1) fail("parallel.layers_per_stage sums to {}, expected model.n_layer = {}", unit - 1, L);
  return out;
}

}  // namespace pipetrain
