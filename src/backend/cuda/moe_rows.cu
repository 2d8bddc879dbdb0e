// Mixture-of-experts row movement on the GPU (Backend::gather_rows, combine_rows,
// row_dots): grid-stride over output elements for the copies and the weighted sums (each
// element's k terms in choice order), one warp per dot product in double. No atomics:
// deterministic, and the same order of terms as the CPU's.
#include "cuda_device.cuh"
#include "cuda_kernels.hpp"

namespace pipetrain::cuda {
namespace {

constexpr unsigned kWarpsPerBlock = 8;

__global__ void gather_rows_kernel(float* out, const float* __restrict__ in, const int32_t* __restrict__ index,
                                   const float* __restrict__ scale, int C, size_t total) {
  for (size_t i = grid_index(); i < total; i += grid_stride()) {
    const size_t r = i / C, c = i % C;
    out[i] = (scale ? scale[r] : 1.0f) * in[static_cast<size_t>(index[r]) * C + c];
  }
}

__global__ void combine_rows_kernel(float* out, const float* __restrict__ in, const int32_t* __restrict__ row,
                                    const float* __restrict__ weight, int k, int C, size_t total) {
  for (size_t i = grid_index(); i < total; i += grid_stride()) {
    const size_t t = i / C, c = i % C;
    float acc = out[i];
    for (int j = 0; j < k; ++j) {
      const int32_t r = row[t * k + j];
      if (r < 0) continue;  // dropped over capacity
      acc += (weight ? weight[r] : 1.0f) * in[static_cast<size_t>(r) * C + c];
    }
    out[i] = acc;
  }
}

__global__ void row_dots_kernel(float* out, const float* __restrict__ a, const float* __restrict__ b,
                                const int32_t* __restrict__ row, int k, int C, int64_t pairs) {
  const int64_t tj = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (tj >= pairs) return;
  const int lane = threadIdx.x & 31;
  const float* x = a + (tj / k) * C;
  const int32_t r = row[tj];  // < 0: dropped over capacity, a dot of 0
  const float* y = b + static_cast<int64_t>(r < 0 ? 0 : r) * C;
  double s = 0;
  if (r >= 0)
    for (int c = lane; c < C; c += 32) s += static_cast<double>(x[c]) * y[c];
  s = warp_sum(s);
  if (lane == 0) out[tj] = static_cast<float>(s);
}

}  // namespace

void gather_rows(const Ctx& ctx, float* out, const float* in, const int32_t* index, const float* scale, int rows,
                 int C) {
  const size_t n = static_cast<size_t>(rows) * C;
  if (rows <= 0 || C <= 0) return;
  gather_rows_kernel<<<grid_for(n, 256, ctx), 256, 0, ctx.stream>>>(out, in, index, scale, C, n);
  check_launch("gather_rows");
}

void combine_rows(const Ctx& ctx, float* out, const float* in, const int32_t* row, const float* weight, int N, int k,
                  int C) {
  const size_t n = static_cast<size_t>(N) * C;
  if (N <= 0 || C <= 0 || k <= 0) return;
  combine_rows_kernel<<<grid_for(n, 256, ctx), 256, 0, ctx.stream>>>(out, in, row, weight, k, C, n);
  check_launch("combine_rows");
}

void row_dots(const Ctx& ctx, float* out, const float* a, const float* b, const int32_t* row, int N, int k, int C) {
  const int64_t pairs = static_cast<int64_t>(N) * k;
  if (pairs <= 0) return;
  const unsigned blocks = static_cast<unsigned>((pairs + kWarpsPerBlock - 1) / kWarpsPerBlock);
  row_dots_kernel<<<blocks, 32 * kWarpsPerBlock, 0, ctx.stream>>>(out, a, b, row, k, C, pairs);
  check_launch("row_dots");
}

}  // namespace pipetrain::cuda
