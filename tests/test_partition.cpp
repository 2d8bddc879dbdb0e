// parallel.layers_per_stage = "auto": the balanced split is the best split an exhaustive
// search finds (smallest slowest stage) for any unit costs, and gives GPT-2 124M's
// pipeline the split a hand-tuned run needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <random>

#include "pipetrain/core/config.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/model/partition.hpp"

namespace pipetrain {
namespace {

double slowest(const ModelConfig& m, const std::vector<int>& blocks, const UnitCosts& c) {
  double worst = 0;
  for (const auto& u : partition_gpt2(m, static_cast<int>(blocks.size()), blocks))
    worst = std::max(worst, stage_cost(m, u, c));
  return worst;
}

// Every split of L blocks over S stages (middle stages at least one block).
double exhaustive_best(const ModelConfig& m, int S, const UnitCosts& c) {
  double best = std::numeric_limits<double>::infinity();
  std::vector<int> blocks(static_cast<size_t>(S));
  std::function<void(int, int)> go = [&](int s, int left) {
    if (s == S - 1) {
      blocks[static_cast<size_t>(s)] = left;
      best = std::min(best, slowest(m, blocks, c));
      return;
    }
    for (int k = (s == 0 ? 0 : 1); k <= left; ++k) {
      blocks[static_cast<size_t>(s)] = k;
      go(s + 1, left - k);
    }
  };
  go(0, m.n_layer);
  return best;
}

TEST(Partition, BalancedSplitIsTheExhaustiveOptimum) {
  std::mt19937 gen(3);
  std::uniform_real_distribution<double> u(0.0, 8.0);
  int cases = 0;
  for (int S = 1; S <= 6; ++S)
    for (int L = std::max(1, S - 2); L <= 13; ++L)
      for (int trial = 0; trial < 6; ++trial) {
        ModelConfig m;
        m.n_layer = L;
        const UnitCosts c{u(gen) * 0.2, 0.5 + u(gen), u(gen)};
        const std::vector<int> blocks = balanced_blocks(m, S, c);
        ASSERT_EQ(static_cast<int>(blocks.size()), S);
        EXPECT_DOUBLE_EQ(slowest(m, blocks, c), exhaustive_best(m, S, c))
            << "S " << S << " L " << L << " costs " << c.embedding << " " << c.block << " " << c.head;
        ++cases;
      }
  EXPECT_GT(cases, 300);
}

TEST(Partition, Gpt2HeadWeighsFiveBlocks) {
  // GPT-2 124M: the LM head and loss cost about V / (12 d) = 5.5 blocks of FLOPs.
  ModelConfig m;
  m.n_layer = 12;
  const UnitCosts c{0.05, 1.0, 50304.0 / (12 * 768)};
  EXPECT_EQ(balanced_blocks(m, 2, c), (std::vector<int>{9, 3}));
  EXPECT_EQ(balanced_blocks(m, 1, c), (std::vector<int>{12}));
  // Equal costs and no ends: as even as possible, earlier stages take the remainder.
  m.n_layer = 9;
  EXPECT_EQ(balanced_blocks(m, 2, UnitCosts{0, 1, 0}), (std::vector<int>{5, 4}));
  EXPECT_THROW(balanced_blocks(m, 12, c), Error);
}

TEST(Partition, AutoIsTheDefaultAndRoundTrips) {
  Config c = parse_config("[data]\ntrain = \"x.h5\"\n[parallel]\nlayers_per_stage = \"auto\"\n", "a.toml");
  EXPECT_TRUE(c.parallel.layers_per_stage.empty());
  EXPECT_NE(to_toml(c).find("layers_per_stage = \"auto\""), std::string::npos) << to_toml(c);
  EXPECT_TRUE(parse_config(to_toml(c), "b.toml").parallel.layers_per_stage.empty());
  c = parse_config("[data]\ntrain = \"x.h5\"\n[parallel]\npp = 2\nlayers_per_stage = [3, 3]\n[model]\nn_layer = 6\n", "a.toml");
  EXPECT_EQ(c.parallel.layers_per_stage, (std::vector<int>{3, 3}));
  EXPECT_THROW(parse_config("[data]\ntrain = \"x.h5\"\n[parallel]\nlayers_per_stage = \"even\"\n", "a.toml"), Error);
}

}  // namespace
}  // namespace pipetrain
