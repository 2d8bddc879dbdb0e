// Llama's kernels on the GPU: RMSNorm (one warp per row; the weight backward one block
// per 32 columns, partials added in a fixed order), rotary embeddings (one thread per
// channel pair, angles in double as on the CPU) and SwiGLU (grid-stride elementwise).
// Deterministic: no atomics.
#include "cuda_device.cuh"
#include "cuda_kernels.hpp"

namespace pipetrain::cuda {
namespace {

constexpr unsigned kWarpsPerBlock = 8;
constexpr int kRows = 16;

__global__ void rmsnorm_forward_kernel(float* out, float* rstd, const float* __restrict__ inp,
                                       const float* __restrict__ weight, int N, int C, float eps) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= N) return;
  const int lane = threadIdx.x & 31;
  const float* x = inp + row * C;
  float ss = 0.0f;
  for (int c = lane; c < C; c += 32) ss += x[c] * x[c];
  const double sum = warp_sum(static_cast<double>(ss));
  const float r = static_cast<float>(1.0 / sqrt(sum / C + static_cast<double>(eps)));
  for (int c = lane; c < C; c += 32) out[row * C + c] = x[c] * r * weight[c];
  if (lane == 0) rstd[row] = r;
}

__global__ void rmsnorm_backward_input_kernel(float* dinp, const float* __restrict__ dout,
                                              const float* __restrict__ inp, const float* __restrict__ weight,
                                              const float* __restrict__ rstd, int N, int C) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= N) return;
  const int lane = threadIdx.x & 31;
  const float* x = inp + row * C;
  const float* d = dout + row * C;
  const float r = rstd[row];
  float s = 0.0f;
  for (int c = lane; c < C; c += 32) s += weight[c] * d[c] * (x[c] * r);
  const float m = warp_sum(s) / static_cast<float>(C);
  for (int c = lane; c < C; c += 32) dinp[row * C + c] += (weight[c] * d[c] - x[c] * r * m) * r;
}

__global__ void rmsnorm_backward_weight_kernel(float* dweight, const float* __restrict__ dout,
                                               const float* __restrict__ inp, const float* __restrict__ rstd, int N,
                                               int C) {
  __shared__ float part[kRows][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  float dw = 0.0f;
  if (c < C)
    for (int n = threadIdx.y; n < N; n += kRows) {
      const size_t i = static_cast<size_t>(n) * C + c;
      dw += dout[i] * (inp[i] * rstd[n]);
    }
  part[threadIdx.y][threadIdx.x] = dw;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float t = 0.0f;
    for (int r = 0; r < kRows; ++r) t += part[r][threadIdx.x];
    dweight[c] += t;
  }
}

// Row b*T + t is at position pos0 + t, or pos0 + positions[b*T + t] (packed documents).
__global__ void rope_kernel(float* x, int B, int T, int ld, int heads, int head_size, float theta, bool inverse,
                            int pos0, const int32_t* positions) {
  const int half = head_size / 2;
  const size_t pairs = static_cast<size_t>(B) * T * heads * half;
  for (size_t p = grid_index(); p < pairs; p += grid_stride()) {
    const int i = static_cast<int>(p % half);
    const size_t rest = p / half;
    const int h = static_cast<int>(rest % heads);
    const size_t row = rest / heads;
    const int t = positions ? positions[row] : static_cast<int>(row % T);
    const double angle = (pos0 + t) * pow(static_cast<double>(theta), -2.0 * i / head_size);
    const float co = static_cast<float>(cos(angle)), si = static_cast<float>(inverse ? -sin(angle) : sin(angle));
    float* q = x + row * ld + h * head_size + 2 * i;
    const float a = q[0], b = q[1];
    q[0] = a * co - b * si;
    q[1] = a * si + b * co;
  }
}

__global__ void swiglu_forward_kernel(float* out, const float* __restrict__ g, const float* __restrict__ u, size_t n) {
  for (size_t i = grid_index(); i < n; i += grid_stride()) {
    const float s = 1.0f / (1.0f + expf(-g[i]));
    out[i] = g[i] * s * u[i];
  }
}

__global__ void swiglu_backward_kernel(float* dg, float* du, const float* dout, const float* __restrict__ g,
                                       const float* __restrict__ u, size_t n) {
  for (size_t i = grid_index(); i < n; i += grid_stride()) {
    const float s = 1.0f / (1.0f + expf(-g[i])), d = dout[i], ui = u[i], gi = g[i];
    dg[i] = d * ui * s * (1.0f + gi * (1.0f - s));
    du[i] = d * gi * s;
  }
}

unsigned row_blocks(int N) { return (static_cast<unsigned>(N) + kWarpsPerBlock - 1) / kWarpsPerBlock; }

}  // namespace

void rmsnorm_forward(const Ctx& ctx, float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                     float eps) {
  if (N <= 0 || C <= 0) return;
  rmsnorm_forward_kernel<<<row_blocks(N), 32 * kWarpsPerBlock, 0, ctx.stream>>>(out, rstd, inp, weight, N, C, eps);
  check_launch("rmsnorm_forward");
}

void rmsnorm_backward_input(const Ctx& ctx, float* dinp, const float* dout, const float* inp, const float* weight,
                            const float* rstd, int N, int C) {
  if (N <= 0 || C <= 0) return;
  rmsnorm_backward_input_kernel<<<row_blocks(N), 32 * kWarpsPerBlock, 0, ctx.stream>>>(dinp, dout, inp, weight,
                                                                                      rstd, N, C);
  check_launch("rmsnorm_backward_input");
}

void rmsnorm_backward_weight(const Ctx& ctx, float* dweight, const float* dout, const float* inp, const float* rstd,
                             int N, int C) {
  if (N <= 0 || C <= 0) return;
  rmsnorm_backward_weight_kernel<<<(C + 31) / 32, dim3(32, kRows), 0, ctx.stream>>>(dweight, dout, inp, rstd, N, C);
  check_launch("rmsnorm_backward_weight");
}

void rope(const Ctx& ctx, float* x, int B, int T, int ld, int heads, int head_size, float theta, bool inverse, int pos0,
          const int32_t* positions) {
  const size_t pairs = static_cast<size_t>(B) * T * heads * (head_size / 2);
  if (pairs == 0) return;
  rope_kernel<<<grid_for(pairs, 256, ctx), 256, 0, ctx.stream>>>(x, B, T, ld, heads, head_size, theta, inverse, pos0,
                                                                 positions);
  check_launch("rope");
}

void swiglu_forward(const Ctx& ctx, float* out, const float* g, const float* u, size_t n) {
  if (n == 0) return;
  swiglu_forward_kernel<<<grid_for(n, 256, ctx), 256, 0, ctx.stream>>>(out, g, u, n);
  check_launch("swiglu_forward");
}

void swiglu_backward(const Ctx& ctx, float* dg, float* du, const float* dout, const float* g, const float* u,
                     size_t n) {
  if (n == 0) return;
  swiglu_backward_kernel<<<grid_for(n, 256, ctx), 256, 0, ctx.stream>>>(dg, du, dout, g, u, n);
  check_launch("swiglu_backward");
}

}  // namespace pipetrain::cuda
