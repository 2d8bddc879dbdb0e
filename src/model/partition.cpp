// Stage pieces and the balanced split of pipetrain/model/partition.hpp.
#include "pipetrain/model/partition.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "pipetrain/core/error.hpp"

namespace pipetrain {

namespace {
// Unit u of a model with L blocks: the cost of one microbatch through it.
double unit_cost(int u, int L, const UnitCosts& c) {
  if (u == 0) return c.embedding;
  if (u == 2 * L + 1) return c.head;
  if (c.attention_share <= 0 || c.attention_share >= 1) return 0.5 * c.block;  // only whole blocks are split
  return (u - 1) % 2 == 0 ? c.attention() : c.mlp();
}
}  // namespace

int model_num_units(const ModelConfig& model) { return 2 * model.n_layer + 2; }

std::vector<StagePiece> stage_pieces(const ModelConfig& model, const StageUnits& units) {
  const int head = model_num_units(model) - 1;
  std::vector<StagePiece> out;
  for (int u = units.first; u < units.last; ++u) {
    if (u == 0) {
      out.push_back({PieceKind::Embedding});
    } else if (u == head) {
      out.push_back({PieceKind::Head});
    } else if (const int half = u - 1; half % 2 == 1) {
      out.push_back({PieceKind::Mlp, half / 2});
    } else if (u + 1 < units.last) {  // both halves of the block
      out.push_back({PieceKind::Block, half / 2});
      ++u;
    } else {
      out.push_back({PieceKind::Attention, half / 2});
    }
  }
  return out;
}

double stage_cost(const ModelConfig& model, const StageUnits& u, const UnitCosts& c) {
  double cost = 0;
  for (int unit = u.first; unit < u.last; ++unit) cost += unit_cost(unit, model.n_layer, c);
  return cost;
}

std::vector<double> blocks_per_stage(const ModelConfig& model, const std::vector<StageUnits>& units) {
  const int head = model_num_units(model) - 1;
  std::vector<double> blocks;
  for (const auto& u : units) blocks.push_back(0.5 * std::max(0, std::min(u.last, head) - std::max(u.first, 1)));
  return blocks;
}

std::vector<double> balanced_blocks(const ModelConfig& model, int S, const UnitCosts& c) {
  const int L = model.n_layer, H = 2 * L;  // halves
  const bool halves = c.attention_share > 0 && c.attention_share < 1;
  const int step = halves ? 1 : 2;        // where stage boundaries may fall, in halves
  if (S < 1) fail("need at least one pipeline stage, got {}", S);
  if (S == 1) return {static_cast<double>(L)};
  if (S - 2 > H / step) fail("{} pipeline stages but only model.n_layer = {} blocks to split", S, L);
  std::vector<double> prefix(static_cast<size_t>(H) + 1, 0.0);  // cost of halves [0, h)
  for (int h = 0; h < H; ++h) prefix[static_cast<size_t>(h) + 1] = prefix[static_cast<size_t>(h)] + unit_cost(h + 1, L, c);
  auto cost = [&](int s, int a, int b) {
    return prefix[static_cast<size_t>(b)] - prefix[static_cast<size_t>(a)] + (s == 0 ? c.embedding : 0.0) +
           (s == S - 1 ? c.head : 0.0);
  };
  // Boundaries to try, latest first: of equal splits a stage takes as little as it can and
  // earlier stages the remainder. Between blocks, then (halves) inside them: in each run a
  // stage's start moves earlier, so its cost only grows.
  std::vector<int> bounds;
  for (int h = H; h >= 0; h -= 2) bounds.push_back(h);
  const size_t whole_blocks = bounds.size();
  if (halves)
    for (int h = H - 1; h > 0; h -= 2) bounds.push_back(h);
  const auto rows = static_cast<size_t>(S), cols = static_cast<size_t>(H) + 1;
  const double inf = std::numeric_limits<double>::infinity();
  // First the smallest possible slowest stage: slowest[s][b] over stages 0..s holding
  // halves [0, b).
  std::vector<std::vector<double>> slowest(rows, std::vector<double>(cols, inf));
  for (int b : bounds) slowest[0][static_cast<size_t>(b)] = cost(0, 0, b);
  // visit(s, a, b): stage s holding halves [a, b), in the bounds' order; a run of starts
  // ends at the first that visit answers false for (a costlier stage would not do either).
  auto for_each_stage = [&](auto&& visit) {
    for (int s = 1; s < S; ++s)
      for (int b : bounds) {
        if (s == S - 1 && b != H) continue;
        for (size_t i = 0; i < bounds.size(); ++i) {
          const int a = bounds[i];
          if (b - a >= (s == S - 1 ? 0 : step) && !visit(s, a, b))
            i = i < whole_blocks ? whole_blocks - 1 : bounds.size();  // on to the next run
        }
      }
  };
  for_each_stage([&](int s, int a, int b) {
    double& v = slowest[static_cast<size_t>(s)][static_cast<size_t>(b)];
    const double cs = cost(s, a, b);
    v = std::min(v, std::max(slowest[static_cast<size_t>(s - 1)][static_cast<size_t>(a)], cs));
    return cs < v;
  });
  const double limit = slowest[rows - 1][static_cast<size_t>(H)];
  // Then, among the splits whose every stage is within that, the fewest blocks cut in two,
  // then the most even (the smallest sum of squared stage costs): both add up over stages,
  // so the same program finds them exactly. The first found wins a tie.
  struct Score {
    int cuts = 0;
    double squares = 0;
    bool operator<(const Score& o) const { return cuts != o.cuts ? cuts < o.cuts : squares < o.squares; }
  };
  const Score none{std::numeric_limits<int>::max(), inf};
  std::vector<std::vector<Score>> score(rows, std::vector<Score>(cols, none));
  std::vector<std::vector<int>> from(rows, std::vector<int>(cols, 0));
  for (int b : bounds)
    if (const double c0 = cost(0, 0, b); c0 <= limit) score[0][static_cast<size_t>(b)] = {b % 2, c0 * c0};
  for_each_stage([&](int s, int a, int b) {
    const Score& prev = score[static_cast<size_t>(s - 1)][static_cast<size_t>(a)];
    const double cs = cost(s, a, b);
    if (cs > limit) return false;
    if (prev.cuts == none.cuts) return true;
    const Score v{prev.cuts + (b % 2), prev.squares + cs * cs};
    if (v < score[static_cast<size_t>(s)][static_cast<size_t>(b)]) {
      score[static_cast<size_t>(s)][static_cast<size_t>(b)] = v;
      from[static_cast<size_t>(s)][static_cast<size_t>(b)] = a;
    }
    return true;
  });
  std::vector<double> blocks(rows);
  for (int s = S - 1, b = H; s >= 0; --s) {
    const int a = s == 0 ? 0 : from[static_cast<size_t>(s)][static_cast<size_t>(b)];
    blocks[static_cast<size_t>(s)] = 0.5 * (b - a);
    b = a;
  }
  return blocks;
}

std::vector<StageUnits> partition_stages(const ModelConfig& model, int num_stages,
                                         const std::vector<double>& layers_per_stage, const UnitCosts& costs) {
  const int L = model.n_layer;
  if (num_stages < 1) fail("need at least one pipeline stage, got {}", num_stages);
  const std::vector<double> blocks =
      layers_per_stage.empty() ? balanced_blocks(model, num_stages, costs) : layers_per_stage;
  if (static_cast<int>(blocks.size()) != num_stages)
    fail("parallel.layers_per_stage has {} entries for {} stages", blocks.size(), num_stages);
  std::vector<StageUnits> out(static_cast<size_t>(num_stages));
  int unit = 1;  // the first block's attention half
  for (int s = 0; s < num_stages; ++s) {
    const double halves = 2 * blocks[static_cast<size_t>(s)];
    if (halves < 0 || halves != std::floor(halves))
      fail("parallel.layers_per_stage[{}] = {} is not a whole or half number of blocks", s, blocks[static_cast<size_t>(s)]);
    out[static_cast<size_t>(s)].first = s == 0 ? 0 : unit;
    unit += static_cast<int>(halves);
    out[static_cast<size_t>(s)].last = s == num_stages - 1 ? 2 * L + 2 : unit;
  }
  if (unit != 2 * L + 1)
    fail("parallel.layers_per_stage sums to {}, expected model.n_layer = {}", 0.5 * (unit - 1), L);
  return out;
}

}  // namespace pipetrain
