// One element of AdamW (bias-corrected moments, decoupled weight decay): the formula the
// CPU backend (backend/cpu/adamw.cpp) and the CUDA backend (backend/cuda/adamw.cu) both
// compile, so they cannot drift. The bias corrections 1 / (1 - beta^step) come in as
// inv_c1, inv_c2 (computed once per call, in double, by the caller). sqrt is IEEE sqrt on
// both (correctly rounded; the CPU file is compiled with -fno-math-errno so it vectorises).
#pragma once

#if !defined(__CUDACC__)
#include <cmath>
#endif

#include "host_device.hpp"

namespace pipetrain {

struct AdamWArgs {
  float lr, beta1, beta2, one_b1, one_b2, eps, weight_decay, inv_c1, inv_c2, grad_scale;
};

// Updates params[i], m[i], v[i] from grads[i].
PIPETRAIN_HOST_DEVICE inline void adamw_step(float* params, const float* grads, float* m, float* v, long long i,
                                             const AdamWArgs& a) {
  const float g = grads[i] * a.grad_scale;
  const float mi = a.beta1 * m[i] + a.one_b1 * g;
  const float vi = a.beta2 * v[i] + a.one_b2 * (g * g);
  m[i] = mi;
  v[i] = vi;
  const float mhat = mi * a.inv_c1;
  const float vhat = vi * a.inv_c2;
  const float p = params[i];
#if defined(__CUDACC__)
  const float root = sqrtf(vhat);
#else
  const float root = std::sqrt(vhat);
#endif
  params[i] = p - a.lr * (mhat / (root + a.eps) + a.weight_decay * p);
}

}  // namespace pipetrain
