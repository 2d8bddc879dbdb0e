// balanced_blocks(), partition_gpt2() and stage_cost() of pipetrain/model/partition.hpp.
#include "pipetrain/model/partition.hpp"

#include <algorithm>
#include <limits>

#include "pipetrain/core/error.hpp"

namespace pipetrain {

double stage_cost(const ModelConfig& model, const StageUnits& u, const UnitCosts& c) {
  double cost = 0;
  for (int unit = u.first; unit < u.last; ++unit)
    cost += unit == 0 ? c.embedding : unit == model.n_layer + 1 ? c.head : c.block;
  return cost;
}

std::vector<int> blocks_per_stage(const ModelConfig& model, const std::vector<StageUnits>& units) {
  std::vector<int> blocks;
  for (const auto& u : units) blocks.push_back(std::max(0, std::min(u.last, model.n_layer + 1) - std::max(u.first, 1)));
  return blocks;
}

std::vector<int> balanced_blocks(const ModelConfig& model, int S, const UnitCosts& c) {
  const int L = model.n_layer;
  if (S < 1) fail("need at least one pipeline stage, got {}", S);
  if (S == 1) return {L};
  if (S - 2 > L) fail("{} pipeline stages but only model.n_layer = {} blocks to split", S, L);
  auto cost = [&](int s, int blocks) {
    return blocks * c.block + (s == 0 ? c.embedding : 0.0) + (s == S - 1 ? c.head : 0.0);
  };
  // best[s][b]: the smallest possible slowest-stage cost of stages 0..s holding b blocks.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(static_cast<size_t>(S), std::vector<double>(static_cast<size_t>(L) + 1, inf));
  std::vector<std::vector<int>> take(best.size(), std::vector<int>(static_cast<size_t>(L) + 1, 0));
  for (int b = 0; b <= L; ++b) best[0][static_cast<size_t>(b)] = cost(0, b), take[0][static_cast<size_t>(b)] = b;
  for (int s = 1; s < S; ++s) {
    const int min_blocks = s == S - 1 ? 0 : 1;
    for (int b = 0; b <= L; ++b)
      for (int k = min_blocks; k <= b; ++k) {
        const double prev = best[static_cast<size_t>(s - 1)][static_cast<size_t>(b - k)];
        const double v = std::max(prev, cost(s, k));
        if (v < best[static_cast<size_t>(s)][static_cast<size_t>(b)]) {
          best[static_cast<size_t>(s)][static_cast<size_t>(b)] = v;
          take[static_cast<size_t>(s)][static_cast<size_t>(b)] = k;
        }
      }
  }
  std::vector<int> blocks(static_cast<size_t>(S));
  for (int s = S - 1, b = L; s >= 0; --s) {
    blocks[static_cast<size_t>(s)] = take[static_cast<size_t>(s)][static_cast<size_t>(b)];
    b -= blocks[static_cast<size_t>(s)];
  }
  return blocks;
}

std::vector<StageUnits> partition_gpt2(const ModelConfig& model, int num_stages,
                                       const std::vector<int>& layers_per_stage, const UnitCosts& costs) {
  const int L = model.n_layer;
  if (num_stages < 1) fail("need at least one pipeline stage, got {}", num_stages);
  const std::vector<int> blocks =
      layers_per_stage.empty() ? balanced_blocks(model, num_stages, costs) : layers_per_stage;
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
