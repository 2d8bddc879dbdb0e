// GELU, tanh approximation (GPT-2):
//   gelu(x) = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3).
// Computed as x * sigmoid(2u), since 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)):
// no cancellation for negative x, and fast_expf keeps the loop vectorised.
// Derivative: s + 2 x s (1 - s) du/dx with s = sigmoid(2u) = 1 / (1 + e),
// e = exp(-2u), and s (1 - s) = e s^2 (no cancellation when s -> 1).
#include "cpu_kernels.hpp"

namespace pipetrain::cpu {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

PIPETRAIN_SIMD_CLONES
void gelu_forward_range(float* out, const float* inp, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    const float x = inp[i];
    const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
    const float s = 1.0f / (1.0f + fast_expf(-2.0f * u));
    out[i] = x * s;
  }
}

PIPETRAIN_SIMD_CLONES
void gelu_backward_range(float* dinp, const float* inp, const float* dout, int64_t begin,
                         int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    const float x = inp[i];
    const float x2 = x * x;
    const float u = kSqrt2OverPi * (x + kCubic * x2 * x);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x2);
    const float ex = fast_expf(-2.0f * u);
    const float s = 1.0f / (1.0f + ex);
    const float grad = s + 2.0f * x * (ex * s * s) * du;  // s (1 - s) = e s^2
    dinp[i] = grad * dout[i];  // dinp may alias dout: read before write
  }
}

}  // namespace

void gelu_forward(float* out, const float* inp, size_t n) {
  for_chunks("pipetrain::gelu_forward", n,
             [=](int64_t b, int64_t e) { gelu_forward_range(out, inp, b, e); });
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
  for_chunks("pipetrain::gelu_backward", n,
             [=](int64_t b, int64_t e) { gelu_backward_range(dinp, inp, dout, b, e); });
}

}  // namespace pipetrain::cpu
