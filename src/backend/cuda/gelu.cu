// GELU, tanh approximation (GPT-2), as in src/backend/cpu/gelu.cpp:
//   gelu(x) = x * sigmoid(2u),  u = sqrt(2/pi) (x + 0.044715 x^3),
//   gelu'(x) = s + 2 x s (1 - s) du/dx,  s = 1 / (1 + e),  e = exp(-2u),
// with s (1 - s) = e s^2. The exponent is clamped to [-87, 88] (as the CPU's
// fast_expf does): e stays finite, so e * s * s never becomes Inf * 0 = NaN.
#include "cuda_device.cuh"
#include "cuda_kernels.hpp"

namespace pipetrain::cuda {
namespace {

constexpr unsigned kThreads = 256;
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

// exp of x clamped to [-87, 88]. A NaN argument becomes a bound here, but the
// callers multiply by x, so a NaN input still gives NaN.
__device__ __forceinline__ float clamped_exp(float x) {
  return expf(fminf(fmaxf(x, -87.0f), 88.0f));
}

__global__ void gelu_forward_kernel(float* out, const float* __restrict__ inp, size_t n) {
  for (size_t i = grid_index(); i < n; i += grid_stride()) {
    const float x = inp[i];
    const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
    const float s = 1.0f / (1.0f + clamped_exp(-2.0f * u));
    out[i] = x * s;
  }
}

// dinp may alias dout: each element is read before it is written, by one thread.
__global__ void gelu_backward_kernel(float* dinp, const float* __restrict__ inp, const float* dout,
                                     size_t n) {
  for (size_t i = grid_index(); i < n; i += grid_stride()) {
    const float x = inp[i];
    const float x2 = x * x;
    const float u = kSqrt2OverPi * (x + kCubic * x2 * x);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x2);
    const float e = clamped_exp(-2.0f * u);
    const float s = 1.0f / (1.0f + e);
    const float grad = s + 2.0f * x * ((e * s) * s) * du;
    dinp[i] = grad * dout[i];
  }
}

__global__ void matrix_epilogue_kernel(float* c, int M, int N, int ldc, const float* __restrict__ bias,
                                       float* pre_gelu) {
  const size_t total = static_cast<size_t>(M) * N;
  for (size_t i = grid_index(); i < total; i += grid_stride()) {
    const size_t at = (i / N) * ldc + i % N;
    float x = c[at] + (bias ? bias[i % N] : 0.0f);
    if (pre_gelu) {
      pre_gelu[at] = x;
      const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
      x = x / (1.0f + clamped_exp(-2.0f * u));
    }
    c[at] = x;
  }
}

}  // namespace

void matrix_epilogue(const Ctx& ctx, float* C, int M, int N, int ldc, const float* bias, float* pre_gelu) {
  const size_t n = static_cast<size_t>(M) * N;
  if (n == 0) return;
  matrix_epilogue_kernel<<<grid_for(n, kThreads, ctx), kThreads, 0, ctx.stream>>>(C, M, N, ldc, bias, pre_gelu);
  check_launch("matrix_epilogue");
}

void gelu_forward(const Ctx& ctx, float* out, const float* inp, size_t n) {
  if (n == 0) return;
  gelu_forward_kernel<<<grid_for(n, kThreads, ctx), kThreads, 0, ctx.stream>>>(out, inp, n);
  check_launch("gelu_forward");
}

void gelu_backward(const Ctx& ctx, float* dinp, const float* inp, const float* dout, size_t n) {
  if (n == 0) return;
  gelu_backward_kernel<<<grid_for(n, kThreads, ctx), kThreads, 0, ctx.stream>>>(dinp, inp, dout,
                                                                                 n);
  check_launch("gelu_backward");
}

}  // namespace pipetrain::cuda
