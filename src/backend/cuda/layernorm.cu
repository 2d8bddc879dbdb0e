// LayerNorm over the last dimension on the GPU: forward and input backward give
// one warp to a row; weight backward gives a block to 32 columns.
//
// Forward statistics in one read of the row, as on the CPU: sums of (x - K) and
// (x - K)^2 with the shift K = x[0] (no catastrophic cancellation when
// |mean| >> std), per-lane partials in float, combined across the warp in double.
#include "cuda_device.cuh"
#include "cuda_kernels.hpp"

namespace pipetrain::cuda {
namespace {

constexpr unsigned kWarpsPerBlock = 8;
constexpr unsigned kRowThreads = 32 * kWarpsPerBlock;

__device__ __forceinline__ int64_t warp_row() {
  return static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
}

__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd,
                                         const float* __restrict__ inp,
                                         const float* __restrict__ weight,
                                         const float* __restrict__ bias, int N, int C, float eps) {
  const int64_t row = warp_row();
  if (row >= N) return;  // whole warps leave together
  const int lane = threadIdx.x & 31;
  const float* x = inp + row * C;
  const float K = x[0];
  float s = 0.0f, ss = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float v = x[c] - K;
    s += v;
    ss += v * v;
  }
  const double sum = warp_sum(static_cast<double>(s));
  const double sumsq = warp_sum(static_cast<double>(ss));
  const double shifted_mean = sum / C;
  double var = sumsq / C - shifted_mean * shifted_mean;
  var = var > 0.0 ? var : 0.0;
  const float m = static_cast<float>(K + shifted_mean);
  const float r = static_cast<float>(1.0 / sqrt(var + static_cast<double>(eps)));
  float* o = out + row * C;
  for (int c = lane; c < C; c += 32) o[c] = (x[c] - m) * r * weight[c] + bias[c];
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// dinp += ((w dout) - mean(w dout) - xhat mean(w dout xhat)) * rstd.
__global__ void layernorm_backward_input_kernel(float* dinp, const float* __restrict__ dout,
                                                const float* __restrict__ inp,
                                                const float* __restrict__ weight,
                                                const float* __restrict__ mean,
                                                const float* __restrict__ rstd, int N, int C) {
  const int64_t row = warp_row();
  if (row >= N) return;
  const int lane = threadIdx.x & 31;
  const float* x = inp + row * C;
  const float* d = dout + row * C;
  const float m = mean[row], r = rstd[row];
  float a = 0.0f, b = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float dn = weight[c] * d[c];
    a += dn;
    b += dn * ((x[c] - m) * r);
  }
  const float ma = warp_sum(a) / static_cast<float>(C);
  const float mb = warp_sum(b) / static_cast<float>(C);
  float* dx = dinp + row * C;
  for (int c = lane; c < C; c += 32) {
    const float xhat = (x[c] - m) * r;
    dx[c] += (weight[c] * d[c] - ma - xhat * mb) * r;
  }
}

// Block (32, kRows): thread (x, y) sums rows y, y + kRows, ... of column
// blockIdx.x * 32 + x; the kRows partials are then added in order. Deterministic.
constexpr int kRows = 16;
__global__ void layernorm_backward_weight_kernel(float* dweight, float* dbias,
                                                 const float* __restrict__ dout,
                                                 const float* __restrict__ inp,
                                                 const float* __restrict__ mean,
                                                 const float* __restrict__ rstd, int N, int C) {
  __shared__ float part_w[kRows][33];
  __shared__ float part_b[kRows][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  float dw = 0.0f, db = 0.0f;
  if (c < C) {
    for (int n = threadIdx.y; n < N; n += kRows) {
      const size_t i = static_cast<size_t>(n) * C + c;
      const float d = dout[i];
      dw += d * ((inp[i] - mean[n]) * rstd[n]);
      db += d;
    }
  }
  part_w[threadIdx.y][threadIdx.x] = dw;
  part_b[threadIdx.y][threadIdx.x] = db;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float tw = 0.0f, tb = 0.0f;
    for (int r = 0; r < kRows; ++r) {
      tw += part_w[r][threadIdx.x];
      tb += part_b[r][threadIdx.x];
    }
    dweight[c] += tw;
    dbias[c] += tb;
  }
}

unsigned row_blocks(int N) {
  return (static_cast<unsigned>(N) + kWarpsPerBlock - 1) / kWarpsPerBlock;
}

}  // namespace

void layernorm_forward(const Ctx& ctx, float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int N, int C, float eps) {
  if (N <= 0 || C <= 0) return;
  layernorm_forward_kernel<<<row_blocks(N), kRowThreads, 0, ctx.stream>>>(out, mean, rstd, inp,
                                                                          weight, bias, N, C, eps);
  check_launch("layernorm_forward");
}

void layernorm_backward_input(const Ctx& ctx, float* dinp, const float* dout, const float* inp,
                              const float* weight, const float* mean, const float* rstd, int N,
                              int C) {
  if (N <= 0 || C <= 0) return;
  layernorm_backward_input_kernel<<<row_blocks(N), kRowThreads, 0, ctx.stream>>>(
      dinp, dout, inp, weight, mean, rstd, N, C);
  check_launch("layernorm_backward_input");
}

void layernorm_backward_weight(const Ctx& ctx, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* mean, const float* rstd, int N,
                               int C) {
  if (N <= 0 || C <= 0) return;
  const dim3 block(32, kRows);
  layernorm_backward_weight_kernel<<<(C + 31) / 32, block, 0, ctx.stream>>>(
      dweight, dbias, dout, inp, mean, rstd, N, C);
  check_launch("layernorm_backward_weight");
}

}  // namespace pipetrain::cuda
