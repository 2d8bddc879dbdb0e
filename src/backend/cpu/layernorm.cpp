// LayerNorm over the last dimension: forward (one pass for mean/variance, one
// to write), backward to the input (accumulates) and to weight/bias
// (accumulates). Rows are the parallel unit of the forward and input-backward
// kernels; the weight-backward kernel owns column blocks so it is race-free.
#include <cmath>

#include "cpu_kernels.hpp"

namespace pipetrain::cpu {
namespace {

PIPETRAIN_SIMD_CLONES
void layernorm_forward_row(float* o, float* mean, float* rstd, const float* x, const float* weight,
                           const float* bias, int C, float eps) {
  // One pass over the row for mean and variance: sums of (x - K) and
  // (x - K)^2 with the shift K = x[0] (the "shifted data" algorithm: no
  // catastrophic cancellation when |mean| >> std), float lanes so that it
  // vectorises, combined in double.
  const float K = x[0];
  float s[kLanes] = {}, ss[kLanes] = {};
  int c = 0;
  for (; c + kLanes <= C; c += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const float v = x[c + j] - K;
      s[j] += v;
      ss[j] += v * v;
    }
  }
  double sum = 0.0, sumsq = 0.0;
  for (; c < C; ++c) {
    const double v = x[c] - K;
    sum += v;
    sumsq += v * v;
  }
  for (int j = 0; j < kLanes; ++j) {
    sum += s[j];
    sumsq += ss[j];
  }
  const double shifted_mean = sum / C;
  double var = sumsq / C - shifted_mean * shifted_mean;
  var = var > 0.0 ? var : 0.0;
  const float m = static_cast<float>(K + shifted_mean);
  const float r = static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(eps)));
  for (int k = 0; k < C; ++k) o[k] = (x[k] - m) * r * weight[k] + bias[k];
  *mean = m;
  *rstd = r;
}

PIPETRAIN_SIMD_CLONES
void layernorm_backward_input_row(float* dx, const float* d, const float* x, const float* weight,
                                  float m, float r, int C) {
  // mean(dnorm) and mean(dnorm * xhat), dnorm = weight * dout.
  float a[kLanes] = {}, b[kLanes] = {};
  int c = 0;
  for (; c + kLanes <= C; c += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const float dn = weight[c + j] * d[c + j];
      a[j] += dn;
      b[j] += dn * ((x[c + j] - m) * r);
    }
  }
  float sa = 0.0f, sb = 0.0f;
  for (; c < C; ++c) {
    const float dn = weight[c] * d[c];
    sa += dn;
    sb += dn * ((x[c] - m) * r);
  }
  for (int j = 0; j < kLanes; ++j) {
    sa += a[j];
    sb += b[j];
  }
  const float ma = sa / static_cast<float>(C);
  const float mb = sb / static_cast<float>(C);
  for (int k = 0; k < C; ++k) {
    const float xhat = (x[k] - m) * r;
    dx[k] += (weight[k] * d[k] - ma - xhat * mb) * r;
  }
}

PIPETRAIN_SIMD_CLONES
void layernorm_backward_weight_cols(float* dweight, float* dbias, const float* dout,
                                    const float* inp, const float* mean, const float* rstd, int N,
                                    int C, int c0, int w) {
  constexpr int kCols = 256;
  float dw[kCols], db[kCols];
  for (int c = 0; c < w; ++c) dw[c] = db[c] = 0.0f;
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<int64_t>(n) * C + c0;
    const float* d = dout + static_cast<int64_t>(n) * C + c0;
    const float m = mean[n];
    const float r = rstd[n];
    for (int c = 0; c < w; ++c) {
      dw[c] += d[c] * ((x[c] - m) * r);
      db[c] += d[c];
    }
  }
  for (int c = 0; c < w; ++c) {
    dweight[c0 + c] += dw[c];
    dbias[c0 + c] += db[c];
  }
}

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C, float eps) {
  Kokkos::parallel_for("pipetrain::layernorm_forward", HostRange(0, N), [=](const int64_t n) {
    layernorm_forward_row(out + n * C, mean + n, rstd + n, inp + n * C, weight, bias, C, eps);
  });
}

void layernorm_backward_input(float* dinp, const float* dout, const float* inp,
                              const float* weight, const float* mean, const float* rstd, int N,
                              int C) {
  Kokkos::parallel_for(
      "pipetrain::layernorm_backward_input", HostRange(0, N), [=](const int64_t n) {
        layernorm_backward_input_row(dinp + n * C, dout + n * C, inp + n * C, weight, mean[n],
                                     rstd[n], C);
      });
}

void layernorm_backward_weight(float* dweight, float* dbias, const float* dout, const float* inp,
                               const float* mean, const float* rstd, int N, int C) {
  // Each work item owns a block of columns and sweeps all rows: race-free.
  constexpr int kCols = 256;
  const int64_t blocks = (C + kCols - 1) / kCols;
  Kokkos::parallel_for(
      "pipetrain::layernorm_backward_weight", HostRange(0, blocks), [=](const int64_t blk) {
        const int c0 = static_cast<int>(blk) * kCols;
        const int w = C - c0 < kCols ? C - c0 : kCols;
        layernorm_backward_weight_cols(dweight, dbias, dout, inp, mean, rstd, N, C, c0, w);
      });
}

}  // namespace pipetrain::cpu
