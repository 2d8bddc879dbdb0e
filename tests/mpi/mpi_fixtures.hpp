// Shared by the MPI test suites: a tiny GPT-2 run and a deterministic token stream.
#pragma once
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>

#include <map>
#include <string>
#include <vector>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/runtime/trainer.hpp"
#include "pipetrain/topology/grid.hpp"

namespace pipetrain::testing {

inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}
inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

inline Config tiny_run_config() {
  Config c;
  c.source = "test";
  c.model.n_layer = 8;
  c.model.n_head = 2;
  c.model.d_model = 16;
  c.model.vocab_size = 50;
  c.model.max_seq_len = 8;
  c.train.seq_len = 8;
  c.train.global_batch = 8;
  c.train.microbatches = 8;
  c.train.lr = 1e-2;
  c.train.lr_schedule = "cosine";
  c.train.warmup_steps = 1;
  c.train.steps = 5;
  c.train.grad_clip = 1.0;
  c.data.train = {"unused"};
  return c;
}

inline void pattern(int64_t first, int count, int32_t* in, int32_t* tgt, int T) {
  for (int k = 0; k < count; ++k)
    for (int t = 0; t <= T; ++t) {
      const auto tok = static_cast<int32_t>(((first + k) * 7 + 3 * t + (t * t) % 5) % 50);
      if (t < T) in[k * T + t] = tok;
      if (t > 0) tgt[k * T + t - 1] = tok;
    }
}

struct RunResult {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> params;
  std::vector<int> peaks;
  std::map<std::string, Parameter> meta;  // shapes and shards of this rank's parameters
};

inline RunResult run(const Config& cfg, MPI_Comm comm) {
  auto backend = make_cpu_backend();
  Grid grid(comm, cfg.parallel, cfg.source);
  const int T = cfg.train.seq_len;
  Trainer trainer(cfg, grid, *backend, [T](int64_t f, int n, int32_t* in, int32_t* tgt) { pattern(f, n, in, tgt, T); });
  RunResult r;
  for (int s = 0; s < cfg.train.steps; ++s) {
    const StepMetrics m = trainer.train_step(s);
    r.losses.push_back(m.loss);
    r.peaks.push_back(m.peak_stashed);
  }
  for (const auto& p : trainer.params().params())
    r.params[p.name] = std::vector<float>(p.value.f32(), p.value.f32() + p.numel());
  for (const auto& p : trainer.params().params()) {
    Parameter m;
    m.shape = p.shape;
    m.global_shape = p.global_shape;
    m.shard = p.shard;
    r.meta[p.name] = m;
  }
  return r;
}

// Same per-step losses (1e-5 relative) and, for every parameter this rank holds, the
// same values as the reference run's (global) tensor restricted to this rank's shard:
// ||got - want|| <= 1e-5 ||want|| per tensor. The key bias (the middle third of
// attn.qkv.b) is skipped: its exact gradient is zero (softmax is invariant to it), so
// its float gradient is rounding noise that AdamW turns into full-size steps, and any
// change in summation order changes it.
inline void expect_same_run(const RunResult& got, const RunResult& ref) {
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  for (size_t s = 0; s < ref.losses.size(); ++s)
    EXPECT_NEAR(got.losses[s], ref.losses[s], 1e-5 * ref.losses[s]) << "step " << s;
  ASSERT_FALSE(got.params.empty());
  for (const auto& [name, values] : got.params) {
    const Parameter& meta = got.meta.at(name);
    const std::vector<float> want = extract_shard(ref.params.at(name), meta.global_shape, meta.shard);
    ASSERT_EQ(values.size(), want.size()) << name;
    const bool qkv_bias = name.ends_with("attn.qkv.b");
    double diff = 0, norm = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      if (qkv_bias && i >= values.size() / 3 && i < 2 * values.size() / 3) continue;
      diff += (double(values[i]) - want[i]) * (double(values[i]) - want[i]);
      norm += double(want[i]) * want[i];
    }
    EXPECT_LE(std::sqrt(diff), 1e-5 * std::sqrt(norm)) << name << " on rank " << world_rank();
  }
}

}  // namespace pipetrain::testing
