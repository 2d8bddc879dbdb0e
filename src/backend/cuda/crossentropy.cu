// Softmax cross-entropy over a padded vocabulary, fused with the gradient (llm.c's
// fused classifier), one block per row: a pass for the max, one for the sum of
// exp(x - max), and, with a gradient, one writing grad_scale * (p - onehot) and
// zeroing the padded columns. The loss is log(sum) + max - x_target with the log in
// double, as on the CPU. Targets were checked by the backend before the launch; a row
// whose target is kIgnoredTarget (packed documents) has loss 0 and a 0 gradient row.
#include "cuda_device.cuh"
#include "cuda_kernels.hpp"
#include "pipetrain/core/documents.hpp"

namespace pipetrain::cuda {
namespace {

__global__ void crossentropy_kernel(float* losses, float* logits,
                                    const int32_t* __restrict__ targets, int V, int Vp,
                                    float grad_scale) {
  const int64_t n = blockIdx.x;
  float* x = logits + n * Vp;
  const int t = targets[n];
  if (t == kIgnoredTarget) {  // takes part nowhere (the whole block returns: no reduction waits)
    if (threadIdx.x == 0) losses[n] = 0.0f;
    if (grad_scale != 0.0f)
      for (int c = threadIdx.x; c < Vp; c += blockDim.x) x[c] = 0.0f;
    return;
  }
  // Read before any thread overwrites the row; a target outside [0, V) (reported by the
  // deferred check after the step) reads nothing.
  const float xt = t >= 0 && t < V ? x[t] : 0.0f;

  float m = -INFINITY;
  for (int c = threadIdx.x; c < V; c += blockDim.x) m = fmaxf(m, x[c]);
  m = block_max(m);
  float s = 0.0f;
  for (int c = threadIdx.x; c < V; c += blockDim.x) s += expf(x[c] - m);
  s = block_sum(s);  // synchronises: every thread has read xt and the row

  if (threadIdx.x == 0) {
    losses[n] = static_cast<float>(log(static_cast<double>(s)) - static_cast<double>(xt - m));
  }
  if (grad_scale == 0.0f) return;
  const float k = grad_scale / s;
  for (int c = threadIdx.x; c < V; c += blockDim.x) {
    float g = expf(x[c] - m) * k;
    if (c == t) g -= grad_scale;
    x[c] = g;
  }
  for (int c = V + threadIdx.x; c < Vp; c += blockDim.x) x[c] = 0.0f;
}

}  // namespace

void crossentropy_forward(const Ctx& ctx, float* losses, float* logits, const int32_t* targets,
                          int N, int V, int Vp, float grad_scale) {
  if (N <= 0) return;
  crossentropy_kernel<<<static_cast<unsigned>(N), row_threads(V), 0, ctx.stream>>>(
      losses, logits, targets, V, Vp, grad_scale);
  check_launch("crossentropy_forward");
}

}  // namespace pipetrain::cuda
