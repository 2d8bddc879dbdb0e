// RMSNorm over the last dimension (Llama): y = x * rstd * weight, rstd = 1/sqrt(mean(x^2) + eps).
// Forward and the input backward run row by row; the weight backward owns column blocks
// (race-free), as LayerNorm's does.
#include <cmath>

#include "cpu_kernels.hpp"

namespace pipetrain::cpu {
namespace {

PIPETRAIN_SIMD_CLONES
void rmsnorm_forward_row(float* o, float* rstd, const float* x, const float* weight, int C, float eps) {
  float ss[kLanes] = {};
  int c = 0;
  for (; c + kLanes <= C; c += kLanes)
    for (int j = 0; j < kLanes; ++j) ss[j] += x[c + j] * x[c + j];
  double sum = 0.0;
  for (; c < C; ++c) sum += static_cast<double>(x[c]) * x[c];
  for (int j = 0; j < kLanes; ++j) sum += ss[j];
  const float r = static_cast<float>(1.0 / std::sqrt(sum / C + static_cast<double>(eps)));
  for (int k = 0; k < C; ++k) o[k] = x[k] * r * weight[k];
  *rstd = r;
}

// dx += r (w d - xhat mean(w d xhat)), xhat = x r.
PIPETRAIN_SIMD_CLONES
void rmsnorm_backward_input_row(float* dx, const float* d, const float* x, const float* weight, float r, int C) {
  float acc[kLanes] = {};
  int c = 0;
  for (; c + kLanes <= C; c += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += weight[c + j] * d[c + j] * (x[c + j] * r);
  float s = 0.0f;
  for (; c < C; ++c) s += weight[c] * d[c] * (x[c] * r);
  for (int j = 0; j < kLanes; ++j) s += acc[j];
  const float m = s / static_cast<float>(C);
  for (int k = 0; k < C; ++k) dx[k] += (weight[k] * d[k] - x[k] * r * m) * r;
}

}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps) {
  Kokkos::parallel_for("pipetrain::rmsnorm_forward", HostRange(0, N), [=](const int64_t n) {
    rmsnorm_forward_row(out + n * C, rstd + n, inp + n * C, weight, C, eps);
  });
}

void rmsnorm_backward_input(float* dinp, const float* dout, const float* inp, const float* weight,
                            const float* rstd, int N, int C) {
  Kokkos::parallel_for("pipetrain::rmsnorm_backward_input", HostRange(0, N), [=](const int64_t n) {
    rmsnorm_backward_input_row(dinp + n * C, dout + n * C, inp + n * C, weight, rstd[n], C);
  });
}

void rmsnorm_backward_weight(float* dweight, const float* dout, const float* inp, const float* rstd, int N, int C) {
  constexpr int kCols = 256;
  const int64_t blocks = (C + kCols - 1) / kCols;
  Kokkos::parallel_for("pipetrain::rmsnorm_backward_weight", HostRange(0, blocks), [=](const int64_t blk) {
    const int c0 = static_cast<int>(blk) * kCols;
    const int w = C - c0 < kCols ? C - c0 : kCols;
    float dw[kCols];
    for (int c = 0; c < w; ++c) dw[c] = 0.0f;
    for (int n = 0; n < N; ++n) {
      const float* x = inp + static_cast<int64_t>(n) * C + c0;
      const float* d = dout + static_cast<int64_t>(n) * C + c0;
      const float r = rstd[n];
      for (int c = 0; c < w; ++c) dw[c] += d[c] * (x[c] * r);
    }
    for (int c = 0; c < w; ++c) dweight[c0 + c] += dw[c];
  });
}

}  // namespace pipetrain::cpu
