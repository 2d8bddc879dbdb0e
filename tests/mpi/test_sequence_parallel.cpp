// Sequence parallelism (parallel.sequence_parallel, on by default wherever tp > 1, so every
// other grid suite runs it on tp = 2): on tp = 4 (each rank a quarter of the tokens), and
// switched off, tp grids match the single-rank run; and on two tp ranks it holds less
// memory than off, the rows between the tensor-parallel products being a tp-th, as the
// estimate says.
#include <gtest/gtest.h>

#include <cstdio>

#include "mpi/mpi_fixtures.hpp"
#include "pipetrain/core/grid_rules.hpp"
#include "pipetrain/model/stage.hpp"

namespace pipetrain {
namespace {

using namespace testing;

Config sp_config(int dp, int pp, int tp, bool llama, Toggle sp) {
  Config c = tiny_run_config();
  c.model.n_layer = 4;
  c.model.vocab_size = 100;
  c.train.microbatches = 2;
  c.train.lr = 3e-3;
  c.train.grad_clip = 0.05;
  c.parallel.dp = dp, c.parallel.pp = pp, c.parallel.tp = tp;
  c.parallel.sequence_parallel = sp;
  if (llama) {
    make_tiny_llama(c);
    c.schedule.name = "zb-h1";
  }
  return c;
}

TEST(SequenceParallel, FourTensorParallelRanksMatchTheSingleRank) {
  if (world_size() != 4) GTEST_SKIP() << "runs on 4 ranks (tp 4)";
  for (bool llama : {false, true}) {
    auto config = [&](int tp) {
      Config c = sp_config(1, 1, tp, llama, Toggle::Auto);
      c.model.n_head = 4;
      c.model.n_kv_head = llama ? 4 : 0;  // a whole key/value head per rank
      c.model.d_model = 32;
      return c;
    };
    const RunResult ref = run(config(1), MPI_COMM_SELF);
    const Config cfg = config(4);
    ASSERT_TRUE(sequence_parallel_on(cfg));
    SCOPED_TRACE(llama ? "llama, tp 4" : "gpt2, tp 4");
    expect_same_run(run(cfg, MPI_COMM_WORLD), ref, cfg);
  }
}

TEST(SequenceParallel, OffStillMatchesTheSingleRank) {
  const int w = world_size();
  if (w != 2 && w != 4) GTEST_SKIP() << "runs on 2 ranks (tp 2) and 4 (pp 2 x tp 2)";
  for (bool llama : {false, true}) {
    const RunResult ref = run(sp_config(1, 1, 1, llama, Toggle::Auto), MPI_COMM_SELF);
    const Config cfg = sp_config(1, w / 2, 2, llama, Toggle::Off);
    ASSERT_FALSE(sequence_parallel_on(cfg));
    SCOPED_TRACE(llama ? "llama, sequence parallelism off" : "gpt2, sequence parallelism off");
    expect_same_run(run(cfg, MPI_COMM_WORLD), ref, cfg);
  }
}

// A model whose rows outweigh its attention probabilities (d_model 256 at 16 tokens), four
// microbatches in flight, selective recomputation: the measured peak falls with sequence
// parallelism, and by the estimate's difference within a quarter (the pool rounds blocks
// and holds transient buffers the estimate leaves out).
TEST(SequenceParallel, HoldsATpthOfTheRowsBetweenProducts) {
  if (world_size() != 2) GTEST_SKIP() << "runs on 2 ranks (tp 2)";
  auto peak = [](Toggle sp) {
    Config c = sp_config(1, 1, 2, false, sp);
    c.model.d_model = 256, c.model.n_head = 4, c.model.n_layer = 2;
    c.model.max_seq_len = c.train.seq_len = 16;
    c.train.global_batch = c.train.microbatches = 4;
    c.train.steps = 1;
    c.train.recompute = "selective";
    Grid grid(MPI_COMM_WORLD, c.parallel, c.source);
    auto backend = make_cpu_backend();
    Trainer t(c, grid, *backend, [](int64_t f, int n, int32_t* in, int32_t* tgt) { pattern(f, n, in, tgt, 16); });
    t.train_step(0);
    double p = t.peak_memory_bytes();
    MPI_Allreduce(MPI_IN_PLACE, &p, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    const double stash =
        stash_bytes(c.model, 1, model_num_units(c.model) - 1, 2, 1, 16, DType::F32, Recompute::Selective,
                    AttentionKeeps::kCausalBlocks, false, sequence_parallel_on(c));
    return std::pair{p, stash};
  };
  const auto [on, stash_on] = peak(Toggle::On);
  const auto [off, stash_off] = peak(Toggle::Off);
  if (world_rank() == 0)
    std::printf(
        "peak per rank: sequence parallel %.0f KiB, off %.0f KiB; estimated stash per microbatch %.0f / %.0f KiB\n",
        on / 1024, off / 1024, stash_on / 1024, stash_off / 1024);
  EXPECT_LT(stash_on, stash_off);
  EXPECT_LT(on, off);
  // the forward stash of four microbatches in flight at once (1f1b on one stage: one at a time)
  EXPECT_GE(off - on, 0.75 * (stash_off - stash_on)) << "the estimate says sequence parallelism saves more";
}

}  // namespace
}  // namespace pipetrain
