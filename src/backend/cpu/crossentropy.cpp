// Softmax cross-entropy over a padded vocabulary, fused with the gradient
// (llm.c's fused classifier). Per row: one pass for the max, one computing
// exp(x - max) and its sum (stored in place when a gradient is wanted), one
// writing grad_scale * (p - onehot) and zeroing the padded columns. A row of
// 50k floats stays in L2 between the passes.
#include <cmath>

#include "cpu_kernels.hpp"
#include "pipetrain/core/error.hpp"

namespace pipetrain::cpu {
namespace {

// One row: returns the loss; overwrites x with the gradient if grad_scale != 0.
PIPETRAIN_SIMD_CLONES
float crossentropy_row(float* x, int t, int V, int Vp, float grad_scale) {
  const float xt = x[t];
  const float m = row_max(x, V);
  float sums[kLanes] = {};
  float sum = 0.0f;
  int c = 0;
  if (grad_scale != 0.0f) {
    for (; c + kLanes <= V; c += kLanes) {
      for (int j = 0; j < kLanes; ++j) {
        const float e = fast_expf(x[c + j] - m);
        x[c + j] = e;
        sums[j] += e;
      }
    }
    for (; c < V; ++c) {
      const float e = fast_expf(x[c] - m);
      x[c] = e;
      sum += e;
    }
  } else {
    for (; c + kLanes <= V; c += kLanes) {
      for (int j = 0; j < kLanes; ++j) sums[j] += fast_expf(x[c + j] - m);
    }
    for (; c < V; ++c) sum += fast_expf(x[c] - m);
  }
  for (int j = 0; j < kLanes; ++j) sum += sums[j];
  if (grad_scale != 0.0f) {
    const float k = grad_scale / sum;
    for (int i = 0; i < V; ++i) x[i] *= k;
    x[t] -= grad_scale;
    for (int i = V; i < Vp; ++i) x[i] = 0.0f;
  }
  // loss = -(x_t - m - log(sum))
  return static_cast<float>(std::log(static_cast<double>(sum)) - (xt - m));
}

}  // namespace

void crossentropy_forward(float* losses, float* logits, const int32_t* targets, int N, int V,
                          int Vp, float grad_scale) {
  if (V <= 0 || Vp < V) fail("crossentropy: need 0 < V <= Vp, got V={} Vp={}", V, Vp);
  // Validate every target before touching anything (never read out of bounds,
  // and never throw from inside a parallel region).
  for (int n = 0; n < N; ++n) {
    if ((targets[n] < 0 || targets[n] >= V) && targets[n] != kIgnoredTarget) {
      fail("crossentropy: target {} at row {} is outside the vocabulary [0, {})", targets[n], n,
           V);
    }
  }
  Kokkos::parallel_for("pipetrain::crossentropy", HostRange(0, N), [=](const int64_t n) {
    if (targets[n] == kIgnoredTarget) {  // takes part nowhere
      losses[n] = 0.0f;
      if (grad_scale != 0.0f)
        for (int c = 0; c < Vp; ++c) logits[n * Vp + c] = 0.0f;
      return;
    }
    losses[n] = crossentropy_row(logits + n * Vp, targets[n], V, Vp, grad_scale);
  });
}

}  // namespace pipetrain::cpu
