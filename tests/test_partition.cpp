// parallel.layers_per_stage = "auto": the balanced split is the best split an exhaustive
// search finds (smallest slowest stage) for any unit costs, and gives GPT-2 124M's
// pipeline the split a hand-tuned run needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <random>

#include <fmt/format.h>
#include <cmath>

#include "pipetrain/core/config.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/model/partition.hpp"

namespace pipetrain {
namespace {

double slowest(const ModelConfig& m, const std::vector<double>& blocks, const UnitCosts& c) {
  double worst = 0;
  for (const auto& u : partition_stages(m, static_cast<int>(blocks.size()), blocks))
    worst = std::max(worst, stage_cost(m, u, c));
  return worst;
}

// Every split of L blocks over S stages, in steps of `step` halves (2: whole blocks; middle
// stages hold at least one step).
double exhaustive_best(const ModelConfig& m, int S, const UnitCosts& c, int step) {
  double best = std::numeric_limits<double>::infinity();
  std::vector<double> blocks(static_cast<size_t>(S));
  std::function<void(int, int)> go = [&](int s, int left) {  // left: halves
    if (s == S - 1) {
      blocks[static_cast<size_t>(s)] = 0.5 * left;
      best = std::min(best, slowest(m, blocks, c));
      return;
    }
    for (int k = (s == 0 ? 0 : step); k <= left; k += step) {
      blocks[static_cast<size_t>(s)] = 0.5 * k;
      go(s + 1, left - k);
    }
  };
  go(0, 2 * m.n_layer);
  return best;
}

TEST(Partition, BalancedSplitIsTheExhaustiveOptimum) {
  std::mt19937 gen(3);
  std::uniform_real_distribution<double> u(0.0, 8.0), share(0.05, 0.95);
  int cases = 0;
  for (bool halves : {false, true})
    for (int S = 1; S <= (halves ? 5 : 6); ++S)
      for (int L = std::max(1, S - 2); L <= (halves ? 9 : 13); ++L)
        for (int trial = 0; trial < 6; ++trial) {
          ModelConfig m;
          m.n_layer = L;
          const UnitCosts c{u(gen) * 0.2, 0.5 + u(gen), u(gen), halves ? share(gen) : 0.0};
          const std::vector<double> blocks = balanced_blocks(m, S, c);
          ASSERT_EQ(static_cast<int>(blocks.size()), S);
          for (double b : blocks) EXPECT_EQ(2 * b, std::floor(2 * b)) << "whole or half blocks";
          if (!halves) {
            for (double b : blocks) EXPECT_EQ(b, std::floor(b)) << "whole blocks without an attention share";
          }
          EXPECT_DOUBLE_EQ(slowest(m, blocks, c), exhaustive_best(m, S, c, halves ? 1 : 2))
              << "S " << S << " L " << L << " costs " << c.embedding << " " << c.block << " " << c.head << " share "
              << c.attention_share;
          ++cases;
        }
  EXPECT_GT(cases, 500);
}

TEST(Partition, Gpt2HeadWeighsFiveBlocks) {
  // GPT-2 124M: the LM head and loss cost about V / (12 d) = 5.5 blocks of FLOPs.
  ModelConfig m;
  m.n_layer = 12;
  const UnitCosts c{0.05, 1.0, 50304.0 / (12 * 768)};
  EXPECT_EQ(balanced_blocks(m, 2, c), (std::vector<double>{9, 3}));
  EXPECT_EQ(balanced_blocks(m, 1, c), (std::vector<double>{12}));
  // Equal costs and no ends: as even as possible, earlier stages take the remainder.
  m.n_layer = 9;
  EXPECT_EQ(balanced_blocks(m, 2, UnitCosts{0, 1, 0}), (std::vector<double>{5, 4}));
  EXPECT_THROW(balanced_blocks(m, 12, c), Error);
}

// With the halves' costs known, the head's stage gets the MLP half of the block at the
// boundary when that evens the stages: a head of 4.9 blocks (attention a third of a block)
// leaves 9,3 at 9.05 : 7.9 and 8,4 at 8.05 : 8.9, but 8.5,3.5 at 8.38 : 8.57.
TEST(Partition, HalfBlocksEvenOutTheHeadsStage) {
  ModelConfig m;
  m.n_layer = 12;
  const UnitCosts c{0.05, 1.0, 4.9, 1.0 / 3};
  EXPECT_EQ(balanced_blocks(m, 2, c), (std::vector<double>{8.5, 3.5}));
  const auto units = partition_stages(m, 2, {}, c);
  EXPECT_EQ(units[0].first, 0);
  EXPECT_EQ(units[0].last, 18);  // embedding, 8 blocks (16 halves), block 8's attention
  EXPECT_EQ(units[1].first, 18);
  EXPECT_EQ(units[1].last, 26);
  EXPECT_EQ(blocks_per_stage(m, units), (std::vector<double>{8.5, 3.5}));
  const auto front = stage_pieces(m, units[0]), back = stage_pieces(m, units[1]);
  ASSERT_EQ(front.size(), 10u);
  EXPECT_EQ(front.front().kind, PieceKind::Embedding);
  EXPECT_EQ(front[8].kind, PieceKind::Block);
  EXPECT_EQ(front.back().kind, PieceKind::Attention);
  EXPECT_EQ(front.back().block, 8);
  ASSERT_EQ(back.size(), 5u);
  EXPECT_EQ(back.front().kind, PieceKind::Mlp);
  EXPECT_EQ(back.front().block, 8);
  EXPECT_EQ(back[1].kind, PieceKind::Block);
  EXPECT_EQ(back[1].block, 9);
  EXPECT_EQ(back.back().kind, PieceKind::Head);
  EXPECT_NEAR(stage_cost(m, units[0], c), 0.05 + 8 + 1.0 / 3, 1e-12);
  EXPECT_NEAR(stage_cost(m, units[1], c), 2.0 / 3 + 3 + 4.9, 1e-12);
  // Where the head's stage alone sets the pace (pp = 4), no block is cut and the other
  // stages are as even as they can be.
  EXPECT_EQ(balanced_blocks(m, 4, UnitCosts{0.05, 1.0, 5.2, 0.36}), (std::vector<double>{4, 4, 4, 0}));
  // An explicit list of the same split gives the same stages; a third of a block does not go.
  EXPECT_EQ(partition_stages(m, 2, {8.5, 3.5})[0].last, 18);
  EXPECT_THROW(partition_stages(m, 2, {8.25, 3.75}), Error);
  EXPECT_THROW(partition_stages(m, 2, {8.5, 3}), Error);
}

TEST(Partition, AutoIsTheDefaultAndRoundTrips) {
  Config c = parse_config("[data]\ntrain = \"x.h5\"\n[parallel]\nlayers_per_stage = \"auto\"\n", "a.toml");
  EXPECT_TRUE(c.parallel.layers_per_stage.empty());
  EXPECT_NE(to_toml(c).find("layers_per_stage = \"auto\""), std::string::npos) << to_toml(c);
  EXPECT_TRUE(parse_config(to_toml(c), "b.toml").parallel.layers_per_stage.empty());
  c = parse_config("[data]\ntrain = \"x.h5\"\n[parallel]\npp = 2\nlayers_per_stage = [3, 3]\n[model]\nn_layer = 6\n", "a.toml");
  EXPECT_EQ(c.parallel.layers_per_stage, (std::vector<double>{3, 3}));
  c = parse_config("[data]\ntrain = \"x.h5\"\n[parallel]\npp = 2\nlayers_per_stage = [3.5, 2.5]\n[model]\nn_layer = 6\n",
                   "a.toml");
  EXPECT_EQ(c.parallel.layers_per_stage, (std::vector<double>{3.5, 2.5}));
  EXPECT_NE(to_toml(c).find("layers_per_stage = [ 3.5, 2.5 ]"), std::string::npos) << to_toml(c);
  EXPECT_EQ(parse_config(to_toml(c), "b.toml").parallel.layers_per_stage, (std::vector<double>{3.5, 2.5}));
  for (const char* bad : {"[3.25, 2.75]", "[6, 0, 0]", "[4, 1]", "[\"3\", 3]"})
    EXPECT_THROW(parse_config(fmt::format("[data]\ntrain = \"x.h5\"\n[parallel]\npp = 2\nlayers_per_stage = {}\n"
                                          "[model]\nn_layer = 6\n",
                                          bad),
                              "a.toml"),
                 Error)
        << bad;
  EXPECT_THROW(parse_config("[data]\ntrain = \"x.h5\"\n[parallel]\nlayers_per_stage = \"even\"\n", "a.toml"), Error);
}

}  // namespace
}  // namespace pipetrain
