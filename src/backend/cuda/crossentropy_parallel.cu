// Vocabulary-parallel softmax cross-entropy on the GPU: the fused kernel of
// crossentropy.cu cut into three phases around the tensor-parallel all-reduces,
// one block per row in each. The shard holds columns [col_begin, col_begin + Vl)
// with row stride Vl, of which the first nreal are real (global index < V); the
// backend computed nreal and checked the targets. Same arithmetic as the fused
// kernel (expf, block reductions, the loss via log in double). A target of kIgnoredTarget
// (packed documents) is no column: target_logit 0, then loss 0 and a 0 gradient row.
#include "cuda_device.cuh"
#include "cuda_kernels.hpp"
#include "pipetrain/core/documents.hpp"

namespace pipetrain::cuda {
namespace {

// rowmax[n] = max of the real columns; -inf when there are none.
__global__ void local_max_kernel(float* rowmax, const float* __restrict__ logits, int Vl,
                                 int nreal) {
  const int64_t n = blockIdx.x;
  const float* x = logits + n * Vl;
  float m = -INFINITY;
  for (int c = threadIdx.x; c < nreal; c += blockDim.x) m = fmaxf(m, x[c]);
  m = block_max(m);
  if (threadIdx.x == 0) rowmax[n] = m;
}

// sumexp[n] = sum of exp(x - rowmax[n]) over the real columns (0 when none);
// target_logit[n] = the target's logit if this shard holds it, else 0.
__global__ void local_sums_kernel(float* sumexp, float* target_logit,
                                  const float* __restrict__ logits,
                                  const float* __restrict__ rowmax,
                                  const int32_t* __restrict__ targets, int Vl, int col_begin,
                                  int nreal) {
  const int64_t n = blockIdx.x;
  const float* x = logits + n * Vl;
  const float m = rowmax[n];
  float s = 0.0f;
  for (int c = threadIdx.x; c < nreal; c += blockDim.x) s += expf(x[c] - m);
  s = block_sum(s);
  if (threadIdx.x == 0) {
    sumexp[n] = s;
    // Targets are < V, so one in [col_begin, col_begin + Vl) is a real column (and an
    // ignored one, -1, is none: col_begin >= 0).
    const int64_t local = static_cast<int64_t>(targets[n]) - col_begin;
    target_logit[n] = local >= 0 && local < Vl ? x[local] : 0.0f;
  }
}

// losses[n] = log(sumexp) + rowmax - target_logit; with a gradient, the real
// columns become grad_scale * (softmax - onehot) and the padding 0.
__global__ void finish_kernel(float* losses, float* logits, const float* __restrict__ rowmax,
                              const float* __restrict__ sumexp,
                              const float* __restrict__ target_logit,
                              const int32_t* __restrict__ targets, int Vl, int col_begin,
                              int nreal, float grad_scale) {
  const int64_t n = blockIdx.x;
  if (targets[n] == kIgnoredTarget) {  // takes part nowhere
    if (threadIdx.x == 0) losses[n] = 0.0f;
    if (grad_scale != 0.0f)
      for (int c = threadIdx.x; c < Vl; c += blockDim.x) logits[n * Vl + c] = 0.0f;
    return;
  }
  const float m = rowmax[n];
  const float s = sumexp[n];
  if (threadIdx.x == 0) {
    losses[n] = static_cast<float>(log(static_cast<double>(s)) -
                                   static_cast<double>(target_logit[n] - m));
  }
  if (grad_scale == 0.0f) return;
  float* x = logits + n * Vl;
  const int64_t local = static_cast<int64_t>(targets[n]) - col_begin;
  const float k = grad_scale / s;
  for (int c = threadIdx.x; c < nreal; c += blockDim.x) {
    float g = expf(x[c] - m) * k;
    if (c == local) g -= grad_scale;
    x[c] = g;
  }
  for (int c = nreal + threadIdx.x; c < Vl; c += blockDim.x) x[c] = 0.0f;
}

}  // namespace

void crossentropy_local_max(const Ctx& ctx, float* rowmax, const float* logits, int N, int Vl,
                            int nreal) {
  if (N <= 0) return;
  local_max_kernel<<<static_cast<unsigned>(N), row_threads(nreal), 0, ctx.stream>>>(rowmax, logits,
                                                                                   Vl, nreal);
  check_launch("crossentropy_local_max");
}

void crossentropy_local_sums(const Ctx& ctx, float* sumexp, float* target_logit,
                             const float* logits, const float* rowmax, const int32_t* targets,
                             int N, int Vl, int col_begin, int nreal) {
  if (N <= 0) return;
  local_sums_kernel<<<static_cast<unsigned>(N), row_threads(nreal), 0, ctx.stream>>>(
      sumexp, target_logit, logits, rowmax, targets, Vl, col_begin, nreal);
  check_launch("crossentropy_local_sums");
}

void crossentropy_finish(const Ctx& ctx, float* losses, float* logits, const float* rowmax,
                         const float* sumexp, const float* target_logit, const int32_t* targets,
                         int N, int Vl, int col_begin, int nreal, float grad_scale) {
  if (N <= 0) return;
  finish_kernel<<<static_cast<unsigned>(N), row_threads(Vl), 0, ctx.stream>>>(
      losses, logits, rowmax, sumexp, target_logit, targets, Vl, col_begin, nreal, grad_scale);
  check_launch("crossentropy_finish");
}

}  // namespace pipetrain::cuda
