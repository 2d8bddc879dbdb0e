// Context parallelism (parallel.cp): each sequence cut into 2 cp chunks, rank i of the cp
// ranks holding chunks i and 2cp-1-i, attention a ring over them, gradients summed over
// dp x cp. GPT-2 (learned positions) under 1f1b and Llama (rotary angles, grouped-query
// attention) under zb-h1 with selective recomputation, ZeRO-1 where there are dp ranks, on
// every grid of the world's size with cp 2 or 4 beside dp, pp and tp, match the single
// rank, as do packed documents spanning chunks and vocabulary parallelism beside cp (fp32 and
// bf16); bad cuts are one-line errors naming the key.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "mpi/mpi_fixtures.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/core/grid_rules.hpp"

namespace pipetrain {
namespace {

using namespace testing;

struct CpGrid {
  int dp, pp, cp, tp;
};

Config cp_config(CpGrid g, bool llama) {
  Config c = tiny_run_config();  // 8 tokens a sequence: chunks of 2 (cp 2) or 1 (cp 4)
  c.model.n_layer = 4;
  c.model.vocab_size = 100;
  c.train.microbatches = 2;
  c.train.lr = 3e-3;
  c.train.grad_clip = 0.05;
  c.parallel.dp = g.dp, c.parallel.pp = g.pp, c.parallel.cp = g.cp, c.parallel.tp = g.tp;
  c.parallel.zero1 = g.dp > 1 && llama;
  if (llama) {
    make_tiny_llama(c);
    c.schedule.name = "zb-h1";
    c.train.recompute = "selective";
  }
  return c;
}

TEST(ContextParallel, EveryGridMatchesTheSingleRank) {
  const std::vector<CpGrid> all = {{1, 1, 2, 1}, {2, 1, 2, 1}, {1, 2, 2, 1}, {1, 1, 2, 2},
                                   {1, 1, 4, 1}, {2, 2, 2, 1}, {1, 2, 2, 2}};
  std::vector<CpGrid> grids;
  for (CpGrid g : all)
    if (g.dp * g.pp * g.cp * g.tp == world_size()) grids.push_back(g);
  if (grids.empty()) GTEST_SKIP() << "no cp grid of the list has " << world_size() << " ranks";
  for (bool llama : {false, true}) {
    const RunResult ref = run(cp_config({1, 1, 1, 1}, llama), MPI_COMM_SELF);
    for (CpGrid g : grids) {
      SCOPED_TRACE(::testing::Message() << (llama ? "llama" : "gpt2") << ", grid dp " << g.dp << " pp " << g.pp
                                        << " cp " << g.cp << " tp " << g.tp);
      const Config cfg = cp_config(g, llama);
      expect_same_run(run(cfg, MPI_COMM_WORLD), ref, cfg);
    }
  }
}

// Packed documents of 1 to 7 tokens (run_compare.hpp's packed_pattern_source) in sequences
// of 8 cut into chunks of 2 or 1: documents span chunks and ranks; each token's keys start
// at its document's first token, its positions are its document's.
TEST(ContextParallel, PackedDocumentsSpanningChunksMatchTheSingleRank) {
  std::vector<CpGrid> grids;
  for (CpGrid g : {CpGrid{1, 1, 2, 1}, CpGrid{1, 2, 2, 1}, CpGrid{1, 1, 4, 1}, CpGrid{2, 1, 4, 1}})
    if (g.dp * g.pp * g.cp * g.tp == world_size()) grids.push_back(g);
  if (grids.empty()) GTEST_SKIP() << "no packed cp grid of the list has " << world_size() << " ranks";
  for (bool llama : {false, true}) {
    const int T = cp_config({1, 1, 1, 1}, llama).train.seq_len;
    const RunResult ref = run(cp_config({1, 1, 1, 1}, llama), MPI_COMM_SELF, packed_pattern_source(T));
    for (CpGrid g : grids) {
      SCOPED_TRACE(::testing::Message() << (llama ? "llama" : "gpt2") << " packed, grid dp " << g.dp << " pp " << g.pp
                                        << " cp " << g.cp);
      const Config cfg = cp_config(g, llama);
      expect_same_run(run(cfg, MPI_COMM_WORLD, packed_pattern_source(T)), ref, cfg);
    }
  }
}

// Vocabulary parallelism beside cp: each (dp, cp) replica's pp ranks slice the output layer
// over their rows (GPT-2, tied table; Llama, untied, bf16 against the single rank's bf16).
TEST(ContextParallel, VocabularyParallelSlicesEachRanksRows) {
  std::vector<CpGrid> grids;
  for (CpGrid g : {CpGrid{1, 2, 2, 1}, CpGrid{1, 2, 2, 2}})
    if (g.dp * g.pp * g.cp * g.tp == world_size()) grids.push_back(g);
  if (grids.empty()) GTEST_SKIP() << "no vocabulary-parallel cp grid of the list has " << world_size() << " ranks";
  for (bool llama : {false, true}) {
    auto config = [&](CpGrid g) {
      Config c = cp_config(g, llama);
      c.parallel.vocab_parallel = g.pp > 1 ? Toggle::On : Toggle::Off;
      if (llama) c.train.precision = "bf16";
      return c;
    };
    const RunResult ref = run(config({1, 1, 1, 1}), MPI_COMM_SELF);
    for (CpGrid g : grids) {
      SCOPED_TRACE(::testing::Message() << (llama ? "llama bf16" : "gpt2") << " vocabulary parallel, grid dp " << g.dp
                                        << " pp " << g.pp << " cp " << g.cp << " tp " << g.tp);
      const Config cfg = config(g);
      expect_same_run(run(cfg, MPI_COMM_WORLD), ref, cfg, Bf16Rounding::OtherPoints);  // the slices round their own
    }
  }
}

// Three ranks: 12 tokens in 6 chunks, each block's gradients passed on twice before home.
TEST(ContextParallel, ThreeRanksMatchTheSingleRank) {
  if (world_size() != 3) GTEST_SKIP() << "runs on 3 ranks (cp 3)";
  for (bool llama : {false, true}) {
    auto config = [&](CpGrid g) {
      Config c = cp_config(g, llama);
      c.train.seq_len = c.model.max_seq_len = 12;
      return c;
    };
    SCOPED_TRACE(llama ? "llama, cp 3" : "gpt2, cp 3");
    const Config cfg = config({1, 1, 3, 1});
    expect_same_run(run(cfg, MPI_COMM_WORLD), run(config({1, 1, 1, 1}), MPI_COMM_SELF), cfg);
  }
}

TEST(ContextParallel, BadCutsAreOneLineErrorsNamingTheKey) {
  Config c = cp_config({1, 1, 3, 1}, false);  // 8 tokens do not cut into 6 chunks
  EXPECT_NE(context_parallel_problem(c).find("parallel.cp"), std::string::npos);
  EXPECT_NE(context_parallel_problem(c).find("train.seq_len"), std::string::npos);
  c.parallel.cp = 2;
  EXPECT_EQ(context_parallel_problem(c), "");
}

}  // namespace
}  // namespace pipetrain
