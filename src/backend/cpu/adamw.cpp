// AdamW with bias correction and decoupled weight decay, elementwise over
// chunks. The bias corrections are computed once per call in double.
#include <cmath>

#include "../adamw_step.hpp"
#include "cpu_kernels.hpp"
#include "pipetrain/core/error.hpp"

namespace pipetrain::cpu {
namespace {

PIPETRAIN_SIMD_CLONES
void adamw_range(float* params, const float* grads, float* m, float* v, int64_t begin,
                 int64_t end, const AdamWArgs& a) {
  for (int64_t i = begin; i < end; ++i) adamw_step(params, grads, m, v, i, a);
}

}  // namespace

void adamw(float* params, const float* grads, float* m, float* v, size_t n, float lr, float beta1,
           float beta2, float eps, float weight_decay, int step, float grad_scale) {
  if (step < 1) fail("adamw: step must start at 1, got {}", step);
  AdamWArgs a{};
  a.lr = lr;
  a.beta1 = beta1;
  a.beta2 = beta2;
  a.one_b1 = 1.0f - beta1;
  a.one_b2 = 1.0f - beta2;
  a.eps = eps;
  a.weight_decay = weight_decay;
  a.inv_c1 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta1), step)));
  a.inv_c2 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta2), step)));
  a.grad_scale = grad_scale;
  for_chunks("pipetrain::adamw", n,
             [=](int64_t b, int64_t e) { adamw_range(params, grads, m, v, b, e, a); });
}

}  // namespace pipetrain::cpu
