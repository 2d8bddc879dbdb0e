// Activation recomputation on one rank: selective and full give the same losses and
// parameters as none, bit for bit (fp32; bf16 full too; bf16 selective recomputes the
// GELU from the stored pre-activation, so it tracks none within the bf16 bound), and the
// stash shrinks: full keeps at most 40% of none's activation memory, selective less
// than none. The pp / tp / dp grids are in tests/mpi/test_recompute.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "model_fixtures.hpp"
#include "pipetrain/backend/backend.hpp"
#include "pipetrain/backend/attention.hpp"
#include "pipetrain/model/stage.hpp"
#include "pipetrain/runtime/trainer.hpp"
#include "pipetrain/topology/grid.hpp"

namespace pipetrain {
namespace {

Config recompute_config(const std::string& mode, const std::string& precision = "fp32") {
  Config c;
  c.model = testing::tiny_model();
  c.model.max_seq_len = 16;
  c.train.seq_len = 16;
  c.train.global_batch = 8;
  c.train.microbatches = 4;
  c.train.steps = 3;
  c.train.lr = 3e-3;
  c.train.grad_clip = 1.0;
  c.train.precision = precision;
  c.train.recompute = mode;
  return c;
}

struct Outcome {
  std::vector<double> losses;
  std::vector<float> params;
};

Outcome train(const Config& c, Backend& be) {
  Grid grid(MPI_COMM_SELF, c.parallel);
  Trainer t(c, grid, be, testing::pattern_source(c.train.seq_len));
  Outcome o;
  for (int s = 0; s < c.train.steps; ++s) o.losses.push_back(t.train_step(s).loss);
  const Tensor& v = t.params().values();
  o.params.assign(v.f32(), v.f32() + v.numel());
  return o;
}

TEST(Recompute, SelectiveAndFullAreBitIdenticalToNone) {
  auto be = make_cpu_backend();
  for (const char* sched : {"1f1b", "zb-h1"})  // zb-h1: recompute at I, kept until W
    for (const char* precision : {"fp32", "bf16"}) {
      Config none = recompute_config("none", precision);
      none.schedule.name = sched;
      const Outcome ref = train(none, *be);
      for (const char* mode : {"selective", "full"}) {
        SCOPED_TRACE(::testing::Message() << sched << ", " << precision << ", " << mode);
        Config c = none;
        c.train.recompute = mode;
        const Outcome got = train(c, *be);
        if (std::string(precision) == "bf16" && std::string(mode) == "selective") {
          // The GELU is recomputed from the bf16-stored pre-activation: one more rounding
          // point per block (2^-8 relative), through forward and backward: 2 n_layer 2^-8.
          const double bound = 2.0 * none.model.n_layer * std::ldexp(1.0, -8);
          for (size_t k = 0; k < got.losses.size(); ++k)
            EXPECT_NEAR(got.losses[k], ref.losses[k], bound * ref.losses[k]);
          continue;
        }
        EXPECT_EQ(got.losses, ref.losses);
        EXPECT_EQ(got.params, ref.params);
      }
    }
}

TEST(Recompute, FullKeepsAtMostFortyPercentOfTheStash) {
  // GPipe on one rank keeps all microbatches' stashes at once: the step's peak above what
  // is allocated before it is the stash plus one layer's working tensors (and, with
  // recomputation, the one block being rebuilt).
  auto be = make_cpu_backend();
  std::map<std::string, double> peak;
  for (const char* mode : {"none", "selective", "full"}) {
    Config c = recompute_config(mode);
    c.model.d_model = 64;
    c.model.n_head = 4;
    c.model.n_layer = 4;
    c.schedule.name = "gpipe";
    c.train.microbatches = 8;
    Grid grid(MPI_COMM_SELF, c.parallel);
    Trainer t(c, grid, *be, testing::pattern_source(16));
    t.train_step(0);
    const size_t before = t.pool().stats().in_use_bytes;
    t.pool().reset_peak();
    t.train_step(1);
    peak[mode] = static_cast<double>(t.pool().stats().peak_in_use_bytes - before);
  }
  std::printf("  activation memory: none %.0f KiB, selective %.0f KiB (%.3f), full %.0f KiB (%.3f)\n",
              peak["none"] / 1024, peak["selective"] / 1024, peak["selective"] / peak["none"], peak["full"] / 1024,
              peak["full"] / peak["none"]);
  EXPECT_LE(peak["full"], 0.4 * peak["none"]);
  EXPECT_LT(peak["selective"], peak["none"]);
  EXPECT_LT(peak["full"], peak["selective"]);
}

TEST(Recompute, TheEstimateFollowsTheMode) {
  ModelConfig m = testing::tiny_model();
  const int units = model_num_units(m);
  const double none = stash_bytes(m, 1, units - 1, 1, 4, 16, DType::F32, Recompute::None);
  const double sel = stash_bytes(m, 1, units - 1, 1, 4, 16, DType::F32, Recompute::Selective);
  const double full = stash_bytes(m, 1, units - 1, 1, 4, 16, DType::F32, Recompute::Full);
  EXPECT_LT(full, sel);
  EXPECT_LT(sel, none);
  // Full keeps each block's input: N x C per block.
  EXPECT_EQ(full, 4.0 * 16 * m.d_model * 4 * m.n_layer);
  // What recomputation rebuilds is what the mode dropped from one block.
  EXPECT_EQ(recompute_bytes(m, 1, 4, 16, DType::F32, Recompute::Full), (none - full) / m.n_layer);
  // A block split between two stages keeps what the whole block keeps, except under full
  // recomputation, where each half keeps its own input.
  for (Recompute mode : {Recompute::None, Recompute::Selective}) {
    EXPECT_EQ(stash_bytes(m, 1, 2, 1, 4, 16, DType::F32, mode) + stash_bytes(m, 2, 3, 1, 4, 16, DType::F32, mode),
              stash_bytes(m, 1, 3, 1, 4, 16, DType::F32, mode));
  }
  EXPECT_EQ(stash_bytes(m, 1, 2, 1, 4, 16, DType::F32, Recompute::Full), 4.0 * 16 * m.d_model * 4);
  EXPECT_EQ(stash_bytes(m, 2, 4, 1, 4, 16, DType::F32, Recompute::Full), 2 * 4.0 * 16 * m.d_model * 4);
  EXPECT_EQ(recompute_bytes(m, 1, 4, 16, DType::F32, Recompute::None), 0.0);
}

// What attention keeps per (sequence, head) follows the device: the CPU's causal blocks,
// CUDA's log-sum-exp up to head size 128 and its T x T probabilities above.
TEST(Recompute, TheEstimateCountsWhatAttentionKeeps) {
  EXPECT_EQ(attention_keeps("cpu", 64), AttentionKeeps::kCausalBlocks);
  EXPECT_EQ(attention_keeps("cpu", 256), AttentionKeeps::kCausalBlocks);
  EXPECT_EQ(attention_keeps("cuda", 128), AttentionKeeps::kLogSumExp);
  EXPECT_EQ(attention_keeps("cuda", 256), AttentionKeeps::kSquare);
  ModelConfig m = testing::tiny_model();
  const int B = 2, T = 200, NH = m.n_head;  // one block, a microbatch of B sequences
  auto block = [&](AttentionKeeps k) { return stash_bytes(m, 1, 3, 1, B, T, DType::BF16, Recompute::None, k); };
  EXPECT_EQ(block(AttentionKeeps::kSquare) - block(AttentionKeeps::kCausalBlocks),
            2.0 * B * NH * (double(T) * T - double(causal_block_elements(T))));
  EXPECT_EQ(block(AttentionKeeps::kCausalBlocks) - block(AttentionKeeps::kLogSumExp),
            2.0 * B * NH * (double(causal_block_elements(T)) - T));
}

}  // namespace
}  // namespace pipetrain
