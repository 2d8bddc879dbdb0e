// Vocabulary-parallel softmax cross-entropy: the fused crossentropy_forward cut
// into three phases around the tensor-parallel all-reduces (max, then sum).
// Each rank holds logit columns [col_begin, col_begin + Vl) with row stride Vl;
// only global columns < V are real. Every phase is parallel over rows and uses
// the same row arithmetic as crossentropy.cpp (order-key max, fast_expf, 32
// float lanes, the loss via log in double), so a single shard holding the whole
// padded vocabulary reproduces crossentropy_forward bit for bit.
#include <cmath>
#include <limits>

#include "cpu_kernels.hpp"
#include "pipetrain/core/error.hpp"

namespace pipetrain::cpu {
namespace {

void check_args(const char* kernel, int N, int Vl, int col_begin, int V) {
  if (V <= 0 || N < 0 || Vl < 0 || col_begin < 0) {
    fail("{}: need V > 0 and N, Vl, col_begin >= 0, got N={} Vl={} col_begin={} V={}", kernel, N,
         Vl, col_begin, V);
  }
}

// Validates every target before any output is touched (never read out of
// bounds, never throw from inside a parallel region).
void check_targets(const char* kernel, const int32_t* targets, int N, int V) {
  for (int n = 0; n < N; ++n) {
    if ((targets[n] < 0 || targets[n] >= V) && targets[n] != kIgnoredTarget) {
      fail("{}: target {} at row {} is outside the vocabulary [0, {})", kernel, targets[n], n, V);
    }
  }
}

// Number of this shard's columns that are real (global index < V), in [0, Vl].
int real_columns(int Vl, int col_begin, int V) {
  const int64_t r = static_cast<int64_t>(V) - col_begin;
  return r <= 0 ? 0 : (r < Vl ? static_cast<int>(r) : Vl);
}

// sum_{c < n} exp(x[c] - m), accumulated exactly as crossentropy_row does.
PIPETRAIN_SIMD_CLONES
float sumexp_row(const float* x, int n, float m) {
  float sums[kLanes] = {};
  float sum = 0.0f;
  int c = 0;
  for (; c + kLanes <= n; c += kLanes) {
    for (int j = 0; j < kLanes; ++j) sums[j] += fast_expf(x[c + j] - m);
  }
  for (; c < n; ++c) sum += fast_expf(x[c] - m);
  for (int j = 0; j < kLanes; ++j) sum += sums[j];
  return sum;
}

// x[c] = exp(x[c] - m) * k on the real columns, 0 on the padding.
PIPETRAIN_SIMD_CLONES
void softmax_grad_row(float* x, int nreal, int Vl, float m, float k) {
  for (int c = 0; c < nreal; ++c) x[c] = fast_expf(x[c] - m) * k;
  for (int c = nreal; c < Vl; ++c) x[c] = 0.0f;
}

PIPETRAIN_SIMD_CLONES
float max_row(const float* x, int n) { return row_max(x, n); }

}  // namespace

void crossentropy_local_max(float* rowmax, const float* logits, int N, int Vl, int col_begin,
                            int V) {
  check_args("crossentropy_local_max", N, Vl, col_begin, V);
  const int nreal = real_columns(Vl, col_begin, V);
  if (nreal == 0) {
    for (int n = 0; n < N; ++n) rowmax[n] = -std::numeric_limits<float>::infinity();
    return;
  }
  Kokkos::parallel_for("pipetrain::crossentropy_local_max", HostRange(0, N),
                       [=](const int64_t n) { rowmax[n] = max_row(logits + n * Vl, nreal); });
}

void crossentropy_local_sums(float* sumexp, float* target_logit, const float* logits,
                             const float* rowmax, const int32_t* targets, int N, int Vl,
                             int col_begin, int V) {
  check_args("crossentropy_local_sums", N, Vl, col_begin, V);
  check_targets("crossentropy_local_sums", targets, N, V);
  const int nreal = real_columns(Vl, col_begin, V);
  Kokkos::parallel_for("pipetrain::crossentropy_local_sums", HostRange(0, N),
                       [=](const int64_t n) {
                         const float* x = logits + n * Vl;
                         sumexp[n] = nreal > 0 ? sumexp_row(x, nreal, rowmax[n]) : 0.0f;
                         // targets < V, so a target in [col_begin, col_begin + Vl) is real
                         // (and an ignored one, -1, is no column).
                         const int64_t local = static_cast<int64_t>(targets[n]) - col_begin;
                         target_logit[n] = local >= 0 && local < Vl ? x[local] : 0.0f;
                       });
}

void crossentropy_finish(float* losses, float* logits, const float* rowmax, const float* sumexp,
                         const float* target_logit, const int32_t* targets, int N, int Vl,
                         int col_begin, int V, float grad_scale) {
  check_args("crossentropy_finish", N, Vl, col_begin, V);
  check_targets("crossentropy_finish", targets, N, V);
  const int nreal = real_columns(Vl, col_begin, V);
  Kokkos::parallel_for("pipetrain::crossentropy_finish", HostRange(0, N), [=](const int64_t n) {
    if (targets[n] == kIgnoredTarget) {  // takes part nowhere
      losses[n] = 0.0f;
      if (grad_scale != 0.0f)
        for (int c = 0; c < Vl; ++c) logits[n * Vl + c] = 0.0f;
      return;
    }
    const float m = rowmax[n];
    const float sum = sumexp[n];
    // loss = -(x_t - m - log(sum)), as crossentropy_row computes it.
    losses[n] = static_cast<float>(std::log(static_cast<double>(sum)) - (target_logit[n] - m));
    if (grad_scale == 0.0f) return;
    float* x = logits + n * Vl;
    softmax_grad_row(x, nreal, Vl, m, grad_scale / sum);
    const int64_t local = static_cast<int64_t>(targets[n]) - col_begin;
    if (local >= 0 && local < Vl) x[local] -= grad_scale;
  });
}

}  // namespace pipetrain::cpu
