// Comparing two training runs of one model: a run's per-step losses, step-0 gradients and
// final parameters, and the bounds within which float32 reordering (another grid, another
// product kernel) may move them. Shared by the unit and MPI suites.
#pragma once
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/core/documents.hpp"
#include "pipetrain/core/shard.hpp"
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
inline void pattern(int64_t first, int count, int32_t* in, int32_t* tgt, int T) {
  for (int k = 0; k < count; ++k)
    for (int t = 0; t <= T; ++t) {
      const auto tok = static_cast<int32_t>(((first + k) * 7 + 3 * t + (t * t) % 5) % 50);
      if (t < T) in[k * T + t] = tok;
      if (t > 0) tgt[k * T + t - 1] = tok;
    }
}

// Sample s packed with documents of 1 + (s + 3d) mod 7 tokens (d = 0, 1, ...) while they
// fit, the rest padding (core/documents.hpp): each document's tokens follow `pattern`'s
// rule from its own start, its last token predicts nothing.
inline int packed_document_length(int64_t sample, int d) { return 1 + static_cast<int>((sample + 3 * d) % 7); }
inline int64_t packed_pattern(int64_t first, int count, int32_t* in, int32_t* tgt, int32_t* pos, int T) {
  int64_t targets = 0;
  for (int k = 0; k < count; ++k) {
    const int64_t s = first + k;
    int t = 0;
    for (int d = 0; t + packed_document_length(s, d) <= T; ++d) {
      const int len = packed_document_length(s, d);
      for (int i = 0; i < len; ++i, ++t) {
        const auto tok = [&](int j) { return static_cast<int32_t>((s * 7 + 11 * d + 3 * j + (j * j) % 5) % 50); };
        if (in) in[k * T + t] = tok(i);
        if (tgt) tgt[k * T + t] = i + 1 < len ? tok(i + 1) : kIgnoredTarget;
        if (pos) pos[k * T + t] = i;
      }
      targets += len - 1;
    }
    for (int i = 0; t < T; ++t, ++i) {
      if (in) in[k * T + t] = 0;
      if (tgt) tgt[k * T + t] = kIgnoredTarget;
      if (pos) pos[k * T + t] = i;
    }
  }
  return targets;
}
inline BatchSource packed_pattern_source(int T) {
  return BatchSource::packed(
      [T](int64_t f, int n, int32_t* in, int32_t* tgt, int32_t* pos) { packed_pattern(f, n, in, tgt, pos, T); },
      [T](int64_t f, int n) { return packed_pattern(f, n, nullptr, nullptr, nullptr, T); });
}

// A seeded fault for the tests that show a bound catches one: on world rank `rank`, the
// samples it loads for step `step` are read from `shift` samples further on (a data loader at
// the wrong offset for one microbatch of one step), with `pattern`'s tokens.
struct DataFault {
  int rank = -1, step = -1;
  int64_t shift = 1;
};
inline BatchSource faulty_pattern_source(const Config& cfg, DataFault f) {
  const int T = cfg.train.seq_len;
  const int64_t first_of_step = int64_t(f.step) * cfg.train.global_batch;
  const bool here = world_rank() == f.rank;
  return [=](int64_t first, int n, int32_t* in, int32_t* tgt) {
    const bool hit = here && first >= first_of_step && first < first_of_step + cfg.train.global_batch;
    pattern(hit ? first + f.shift : first, n, in, tgt, T);
  };
}

struct RunResult {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> params;     // after the last step
  std::map<std::string, std::vector<float>> grads0;     // step 0's reduced gradient (before any update)
  double grad_norm0 = 0;                                // and its global norm (the step's metric)
  std::vector<int> peaks;
  std::vector<double> bytes_sent;         // pipeline bytes this rank sent, per step
  std::vector<int> copies_refreshed;      // runtime.pack_weights: copies refreshed while waiting, per step
  std::map<std::string, Parameter> meta;  // shapes and shards of this rank's parameters
  double lr_sum = 0;                      // sum of the learning rates of the steps run
};

// source: the samples (empty: `pattern`'s). paths: the dense products' paths to run
// (Backend::set_dense_paths) in place of those the trainer resolved.
inline RunResult run(const Config& cfg, MPI_Comm comm, Backend& backend, BatchSource source = {},
                     const DensePaths* paths = nullptr) {
  Grid grid(comm, cfg.parallel, cfg.source);
  const int T = cfg.train.seq_len;
  if (!source) source = [T](int64_t f, int n, int32_t* in, int32_t* tgt) { pattern(f, n, in, tgt, T); };
  Trainer trainer(cfg, grid, backend, std::move(source));
  if (paths && !backend.set_dense_paths(*paths)) throw Error("the backend cannot run these dense products' paths");
  RunResult r;
  for (int s = 0; s < cfg.train.steps; ++s) {
    const StepMetrics m = trainer.train_step(s);
    r.losses.push_back(m.loss);
    r.peaks.push_back(m.peak_stashed);
    r.bytes_sent.push_back(m.pp_bytes_sent);
    r.copies_refreshed.push_back(trainer.last_stats().copies_refreshed);
    r.lr_sum += m.lr;
    if (s == 0) {
      r.grad_norm0 = m.grad_norm;
      const std::vector<float> g = trainer.reduced_gradients();
      for (const auto& p : trainer.params().params())
        r.grads0[p.name] = std::vector<float>(g.begin() + p.offset, g.begin() + p.offset + p.numel());
    }
  }
  trainer.gather_weights();  // (sharded weights: the whole units)
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
inline RunResult run(const Config& cfg, MPI_Comm comm, BatchSource source = {}) {
  auto backend = make_cpu_backend();
  return run(cfg, comm, *backend, std::move(source));
}

// The bounds below hold on any machine and BLAS kernel: a parallel layout computes the
// same sums as the single-rank run in another order (split over tp ranks, summed over dp
// replicas and microbatches, other gemm blockings), and float32 reordering is all that
// may differ.
//
// Gradients, compared before any update: each element is a chain of ~L = 6 n_layer + 4
// reductions (forward and backward products, LayerNorm, softmax, the loss), each of
// length <= N = max(B*T, 4d, V); reordering one sum moves it by ~sqrt(N) u relative
// (u = 2^-24, random-walk rounding), so a tensor's relative L2 difference is at most
// e = L sqrt(N) u = 28 * 11.3 * 6.0e-8 = 1.9e-5 for the grid suite (n_layer 4, N 128).
inline double gradient_bound(const Config& c) {
  const double u = std::ldexp(1.0, -24);
  const double N = std::max({double(c.train.global_batch) * c.train.seq_len, 4.0 * c.model.d_model,
                             double(c.model.vocab_size)});
  return (6.0 * c.model.n_layer + 4.0) * std::sqrt(N) * u;
}

// Under train.precision = "bf16", where both runs round the same values to bf16 at the same
// points: a layout's f32 reordering (relative e, above) flips a rounding for a fraction
// ~ e / 2^-9 of the elements, each flip moving that element by one bf16 step (2^-8
// relative): sqrt(2^9 e) 2^-8 relative per rounding point. The R = 16 n_layer + 8 points
// along forward and backward flip independently, so their errors add in quadrature:
// sqrt(R) sqrt(2^9 e) 2^-8 (0.0031 for the grid suite).
inline double bf16_layout_bound(const Config& c) {
  const double e = gradient_bound(c);
  return e + std::sqrt(16.0 * c.model.n_layer + 8.0) * std::sqrt(512.0 * e) * std::ldexp(1.0, -8);
}

// bf16 runs that round other values at some point (vocabulary parallelism rounds each slice's
// exp(logit - slice max) in the backward where one rank rounds softmax - one-hot; selective
// recomputation and oneDNN's attention read q, k, v rounded where the forward read them in
// f32): from that point on every rounding may differ, each of the R points adding up to one
// bf16 step (2^-8 relative), in quadrature: sqrt(R) 2^-8 (0.033 for the grid suite).
inline double bf16_other_points_bound(const Config& c) {
  return bf16_layout_bound(c) + std::sqrt(16.0 * c.model.n_layer + 8.0) * std::ldexp(1.0, -8);
}
enum class Bf16Rounding { SamePoints, OtherPoints };

// The loss is the mean of the step's M = global_batch x seq_len token losses, each moved by
// the tensor bound e at most, independently: e / sqrt(M) relative.
inline double loss_bound(const Config& c, double e) {
  return e / std::sqrt(double(c.train.global_batch) * c.train.seq_len);
}

inline double l2(const std::vector<float>& a) {
  double d = 0;
  for (float x : a) d += double(x) * x;
  return std::sqrt(d);
}
inline double l2_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return std::sqrt(d);
}

// Parameters after the steps. AdamW's update lr m/(sqrt(v)+eps) has size ~lr whatever the
// gradient's size, so rounding matters through each element's *relative* gradient
// error: an absolute error d = e rms(g) (the tensor bound spread evenly) on an element
// with gradient g_i changes its update by <= 2 lr min(1, d/|g_i|) — near-zero gradients
// (the key bias's are exactly zero: softmax ignores it) may flip sign and move by 2 lr.
// Summed over the steps and the tensor (g = the reference's step-0 gradient):
//   ||p - p_ref|| <= 2 sum(lr_t) sqrt(sum_i min(1, d/|g_i|)^2).
inline double parameter_bound(double e, double lr_sum, const std::vector<float>& g) {
  const double d = e * l2(g) / std::sqrt(double(std::max<size_t>(g.size(), 1)));
  double s = 0;
  for (float gi : g) {
    const double r = std::abs(gi) > d ? d / std::abs(gi) : 1.0;
    s += r * r;
  }
  return 2.0 * lr_sum * std::sqrt(s);
}

// Same step-0 gradients, per-step losses and final parameters as the reference run,
// within the bounds above, for every parameter this rank holds (compared with the
// reference's global tensor restricted to this rank's shard).
//
// PIPETRAIN_REPORT_BOUNDS=1 prints, per comparison, the largest ratio of a difference to its
// bound (loss, step-0 gradient, parameter): how much room each bound leaves on this machine.
inline void expect_same_run(const RunResult& got, const RunResult& ref, const Config& cfg,
                            Bf16Rounding rounding = Bf16Rounding::SamePoints) {
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  const double e = cfg.train.precision != "bf16"             ? gradient_bound(cfg)
                   : rounding == Bf16Rounding::SamePoints ? bf16_layout_bound(cfg)
                                                          : bf16_other_points_bound(cfg);
  double worst[3] = {0, 0, 0};  // loss, gradient, parameter: difference over bound
  auto seen = [&](int k, double diff, double bound) {
    worst[k] = std::max(worst[k], bound > 0 ? diff / bound : diff > 0 ? INFINITY : 0.0);
    return diff;
  };
  // Loss: a mean of token log-softmax values (loss_bound); the parameter differences
  // allowed below sit where the gradient is near zero and move it by far less.
  const double el = loss_bound(cfg, e);
  for (size_t s = 0; s < ref.losses.size(); ++s)
    EXPECT_LE(seen(0, std::abs(got.losses[s] - ref.losses[s]), el * ref.losses[s]), el * ref.losses[s])
        << "loss at step " << s << " on rank " << world_rank() << ": " << got.losses[s] << " against "
        << ref.losses[s] << ", relative bound " << el;
  // The global norm of step 0's gradients: each tensor within e relative, so the norm too.
  EXPECT_NEAR(got.grad_norm0, ref.grad_norm0, e * ref.grad_norm0) << "step 0's gradient norm on rank " << world_rank();
  ASSERT_FALSE(got.params.empty());
  for (const auto& [name, values] : got.grads0) {
    const Parameter& meta = got.meta.at(name);
    const std::vector<float> want = extract_shard(ref.grads0.at(name), meta.global_shape, meta.shard);
    ASSERT_EQ(values.size(), want.size()) << name;
    EXPECT_LE(seen(1, l2_diff(values, want), e * l2(want)), e * l2(want))
        << "gradient of " << name << " (step 0) on rank " << world_rank() << ": relative difference "
        << l2_diff(values, want) / l2(want) << ", bound " << e;
  }
  for (const auto& [name, values] : got.params) {
    const Parameter& meta = got.meta.at(name);
    const std::vector<float> want = extract_shard(ref.params.at(name), meta.global_shape, meta.shard);
    const std::vector<float> g = extract_shard(ref.grads0.at(name), meta.global_shape, meta.shard);
    ASSERT_EQ(values.size(), want.size()) << name;
    const double bound = parameter_bound(e, ref.lr_sum, g);
    EXPECT_LE(seen(2, l2_diff(values, want), bound), bound)
        << name << " on rank " << world_rank() << ": L2 difference " << l2_diff(values, want) << ", bound " << bound;
  }
  static const bool report = std::getenv("PIPETRAIN_REPORT_BOUNDS") != nullptr;
  if (report)
    std::printf("bounds: %s, %s, rank %d: e %.3g; worst difference / bound: loss %.3f, gradient %.3f, parameter %.3f\n",
                ::testing::UnitTest::GetInstance()->current_test_info()->name(), cfg.train.precision.c_str(),
                world_rank(), e, worst[0], worst[1], worst[2]);
}

}  // namespace pipetrain::testing
