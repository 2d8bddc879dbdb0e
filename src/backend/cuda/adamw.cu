// AdamW with bias correction and decoupled weight decay, elementwise: the formula of
// src/backend/adamw_step.hpp, which the CPU backend compiles too. The bias corrections
// 1 / (1 - beta^step) are computed once per call on the host, in double.
#include "../adamw_step.hpp"
#include "cuda_device.cuh"
#include "cuda_kernels.hpp"

namespace pipetrain::cuda {
namespace {

constexpr unsigned kThreads = 256;

__global__ void adamw_kernel(float* params, const float* __restrict__ grads, float* m, float* v,
                             size_t n, AdamWArgs a) {
  for (size_t i = grid_index(); i < n; i += grid_stride())
    adamw_step(params, grads, m, v, static_cast<long long>(i), a);
}

}  // namespace

void adamw(const Ctx& ctx, float* params, const float* grads, float* m, float* v, size_t n,
           float lr, float beta1, float beta2, float eps, float weight_decay, float inv_c1,
           float inv_c2, float grad_scale) {
  if (n == 0) return;
  AdamWArgs a{};
  a.lr = lr;
  a.beta1 = beta1;
  a.beta2 = beta2;
  a.one_b1 = 1.0f - beta1;
  a.one_b2 = 1.0f - beta2;
  a.eps = eps;
  a.weight_decay = weight_decay;
  a.inv_c1 = inv_c1;
  a.inv_c2 = inv_c2;
  a.grad_scale = grad_scale;
  adamw_kernel<<<grid_for(n, kThreads, ctx), kThreads, 0, ctx.stream>>>(params, grads, m, v, n, a);
  check_launch("adamw");
}

}  // namespace pipetrain::cuda
