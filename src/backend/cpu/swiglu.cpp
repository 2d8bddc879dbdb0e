// SwiGLU (Llama's MLP activation): h = silu(g) * u, silu(g) = g / (1 + exp(-g)).
#include <cmath>

#include "cpu_kernels.hpp"

namespace pipetrain::cpu {
namespace {

PIPETRAIN_SIMD_CLONES
void swiglu_forward_range(float* out, const float* g, const float* u, int64_t b, int64_t e) {
  for (int64_t i = b; i < e; ++i) {
    const float s = 1.0f / (1.0f + std::exp(-g[i]));
    out[i] = g[i] * s * u[i];
  }
}

// dg = dh u silu'(g), silu'(g) = s (1 + g (1 - s)); du = dh silu(g). dg, du may alias dh.
PIPETRAIN_SIMD_CLONES
void swiglu_backward_range(float* dg, float* du, const float* dh, const float* g, const float* u, int64_t b,
                           int64_t e) {
  for (int64_t i = b; i < e; ++i) {
    const float s = 1.0f / (1.0f + std::exp(-g[i])), d = dh[i], ui = u[i];
    dg[i] = d * ui * s * (1.0f + g[i] * (1.0f - s));
    du[i] = d * g[i] * s;
  }
}

}  // namespace

void swiglu_forward(float* out, const float* g, const float* u, size_t n) {
  for_chunks("pipetrain::swiglu_forward", n, [=](int64_t b, int64_t e) { swiglu_forward_range(out, g, u, b, e); });
}

void swiglu_backward(float* dg, float* du, const float* dout, const float* g, const float* u, size_t n) {
  for_chunks("pipetrain::swiglu_backward", n,
             [=](int64_t b, int64_t e) { swiglu_backward_range(dg, du, dout, g, u, b, e); });
}

}  // namespace pipetrain::cpu
