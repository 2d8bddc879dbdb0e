// Elementwise kernels and reductions on the GPU: fill, scale_matrix (gemm with
// K = 0), add, accumulate, scale, sum_squares, all_finite, bias_add, bias_backward.
// Grid-stride loops; the reductions are two-stage with a fixed grid, so their
// results do not depend on the device or on scheduling.
#include "cuda_device.cuh"
#include "cuda_kernels.hpp"

namespace pipetrain::cuda {
namespace {

constexpr unsigned kThreads = 256;
// sum_squares: stage-one blocks (fixed, so the summation order is too).
constexpr unsigned kSumBlocks = 1024;

__global__ void fill_kernel(float* x, float value, size_t n) {
  for (size_t i = grid_index(); i < n; i += grid_stride()) x[i] = value;
}

__global__ void scale_matrix_kernel(float* c, int M, int N, int ldc, float beta) {
  const size_t total = static_cast<size_t>(M) * N;
  for (size_t i = grid_index(); i < total; i += grid_stride()) {
    float* p = c + (i / N) * ldc + i % N;
    *p = beta == 0.0f ? 0.0f : beta * *p;
  }
}

// out may alias a or b: no __restrict__.
__global__ void add_kernel(float* out, const float* a, const float* b, size_t n) {
  for (size_t i = grid_index(); i < n; i += grid_stride()) out[i] = a[i] + b[i];
}

__global__ void accumulate_kernel(float* out, const float* a, size_t n) {
  for (size_t i = grid_index(); i < n; i += grid_stride()) out[i] += a[i];
}

__global__ void scale_kernel(float* x, float s, size_t n) {
  for (size_t i = grid_index(); i < n; i += grid_stride()) x[i] *= s;
}

// Round to nearest even, NaN kept quiet (the host's pipetrain::to_bf16).
__global__ void cast_to_bf16_kernel(uint16_t* out, const float* in, size_t n) {
  for (size_t i = grid_index(); i < n; i += grid_stride()) {
    uint32_t u = __float_as_uint(in[i]);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      out[i] = static_cast<uint16_t>((u >> 16) | 0x0040u);
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);
      out[i] = static_cast<uint16_t>(u >> 16);
    }
  }
}

__global__ void cast_to_f32_kernel(float* out, const uint16_t* in, size_t n) {
  for (size_t i = grid_index(); i < n; i += grid_stride()) out[i] = __uint_as_float(static_cast<uint32_t>(in[i]) << 16);
}

// Stage one: partial[b] = sum of x[i]^2 (in double) over block b's grid-stride slice.
__global__ void sum_squares_partial_kernel(double* partial, const float* __restrict__ x,
                                           size_t n) {
  double s = 0.0;
  for (size_t i = grid_index(); i < n; i += grid_stride()) {
    const double v = x[i];
    s += v * v;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// Stage two, one block: partial[count] = sum of partial[0 .. count).
__global__ void sum_partials_kernel(double* partial, unsigned count) {
  double s = 0.0;
  for (unsigned i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
  s = block_sum(s);
  if (threadIdx.x == 0) partial[count] = s;
}

// Sets *flag when some x[i] is Inf or NaN (exponent bits all ones).
__global__ void all_finite_kernel(int* flag, const float* __restrict__ x, size_t n) {
  unsigned any = 0;
  for (size_t i = grid_index(); i < n; i += grid_stride()) {
    const unsigned u = __float_as_uint(x[i]);
    any |= static_cast<unsigned>((u & 0x7f800000u) == 0x7f800000u);
  }
  if (__syncthreads_or(any) && threadIdx.x == 0) *flag = 1;
}

__global__ void bias_add_kernel(float* out, const float* __restrict__ bias, int N, int C) {
  const size_t total = static_cast<size_t>(N) * C;
  for (size_t i = grid_index(); i < total; i += grid_stride()) out[i] += bias[i % C];
}

// Block (32, kRows): 32 columns per block; thread (x, y) sums rows y, y + kRows, ...
// of column x, then the kRows partials are added in order of y. Deterministic.
constexpr int kRows = 16;
__global__ void bias_backward_kernel(float* dbias, const float* __restrict__ dout, int N, int C) {
  __shared__ float part[kRows][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  float s = 0.0f;
  if (c < C) {
    for (int n = threadIdx.y; n < N; n += kRows) s += dout[static_cast<size_t>(n) * C + c];
  }
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float t = 0.0f;
    for (int r = 0; r < kRows; ++r) t += part[r][threadIdx.x];
    dbias[c] += t;
  }
}

}  // namespace

void fill(const Ctx& ctx, float* x, float value, size_t n) {
  if (n == 0) return;
  fill_kernel<<<grid_for(n, kThreads, ctx), kThreads, 0, ctx.stream>>>(x, value, n);
  check_launch("fill");
}

void scale_matrix(const Ctx& ctx, float* C, int M, int N, int ldc, float beta) {
  if (M <= 0 || N <= 0) return;
  const size_t total = static_cast<size_t>(M) * N;
  scale_matrix_kernel<<<grid_for(total, kThreads, ctx), kThreads, 0, ctx.stream>>>(C, M, N, ldc,
                                                                                   beta);
  check_launch("gemm (K = 0)");
}

void add(const Ctx& ctx, float* out, const float* a, const float* b, size_t n) {
  if (n == 0) return;
  add_kernel<<<grid_for(n, kThreads, ctx), kThreads, 0, ctx.stream>>>(out, a, b, n);
  check_launch("add");
}

void accumulate(const Ctx& ctx, float* out, const float* a, size_t n) {
  if (n == 0) return;
  accumulate_kernel<<<grid_for(n, kThreads, ctx), kThreads, 0, ctx.stream>>>(out, a, n);
  check_launch("accumulate");
}

void scale(const Ctx& ctx, float* x, float s, size_t n) {
  if (n == 0) return;
  scale_kernel<<<grid_for(n, kThreads, ctx), kThreads, 0, ctx.stream>>>(x, s, n);
  check_launch("scale");
}

void cast_to_bf16(const Ctx& ctx, uint16_t* out, const float* in, size_t n) {
  if (n == 0) return;
  cast_to_bf16_kernel<<<grid_for(n, kThreads, ctx), kThreads, 0, ctx.stream>>>(out, in, n);
  check_launch("cast_to_bf16");
}

void cast_to_f32(const Ctx& ctx, float* out, const uint16_t* in, size_t n) {
  if (n == 0) return;
  cast_to_f32_kernel<<<grid_for(n, kThreads, ctx), kThreads, 0, ctx.stream>>>(out, in, n);
  check_launch("cast_to_f32");
}

double sum_squares(const Ctx& ctx, const float* x, size_t n) {
  if (n == 0) return 0.0;
  static_assert((kSumBlocks + 1) * sizeof(double) <= kScratchBytes, "scratch too small");
  double* partial = static_cast<double*>(ctx.scratch);
  size_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks > kSumBlocks) blocks = kSumBlocks;
  const unsigned nb = static_cast<unsigned>(blocks);
  sum_squares_partial_kernel<<<nb, kThreads, 0, ctx.stream>>>(partial, x, n);
  check_launch("sum_squares");
  sum_partials_kernel<<<1, 1024, 0, ctx.stream>>>(partial, nb);
  check_launch("sum_squares (final)");
  double result = 0.0;
  PIPETRAIN_CUDA_CHECK(cudaMemcpyAsync(&result, partial + nb, sizeof(double),
                                       cudaMemcpyDeviceToHost, ctx.stream));
  PIPETRAIN_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
  return result;
}

bool all_finite(const Ctx& ctx, const float* x, size_t n) {
  if (n == 0) return true;
  int* flag = static_cast<int*>(ctx.scratch);
  PIPETRAIN_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int), ctx.stream));
  all_finite_kernel<<<grid_for(n, kThreads, ctx), kThreads, 0, ctx.stream>>>(flag, x, n);
  check_launch("all_finite");
  int bad = 0;
  PIPETRAIN_CUDA_CHECK(
      cudaMemcpyAsync(&bad, flag, sizeof(int), cudaMemcpyDeviceToHost, ctx.stream));
  PIPETRAIN_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
  return bad == 0;
}

void bias_add(const Ctx& ctx, float* out, const float* bias, int N, int C) {
  if (N <= 0 || C <= 0) return;
  const size_t total = static_cast<size_t>(N) * C;
  bias_add_kernel<<<grid_for(total, kThreads, ctx), kThreads, 0, ctx.stream>>>(out, bias, N, C);
  check_launch("bias_add");
}

void bias_backward(const Ctx& ctx, float* dbias, const float* dout, int N, int C) {
  if (N <= 0 || C <= 0) return;
  const dim3 block(32, kRows);
  bias_backward_kernel<<<(C + 31) / 32, block, 0, ctx.stream>>>(dbias, dout, N, C);
  check_launch("bias_backward");
}

}  // namespace pipetrain::cuda
