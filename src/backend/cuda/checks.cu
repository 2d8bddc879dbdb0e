// Range checks of device-resident integer inputs (targets of the cross-entropy
// kernels, tokens of the embedding): the smallest offending index, found with
// atomicMin (order-independent, so deterministic), and its value, both copied back
// so that the backend can throw an Error naming them before any output is written.
#include <climits>

#include "cuda_device.cuh"
#include "cuda_kernels.hpp"

namespace pipetrain::cuda {
namespace {

constexpr unsigned kThreads = 256;

__global__ void first_out_of_range_kernel(unsigned long long* first, const int32_t* __restrict__ v,
                                          size_t n, int64_t lo, int64_t hi) {
  for (size_t i = grid_index(); i < n; i += grid_stride()) {
    const int64_t x = v[i];
    if (x < lo || x >= hi) atomicMin(first, static_cast<unsigned long long>(i));
  }
}

__global__ void record_out_of_range_kernel(unsigned long long* record, const int32_t* __restrict__ v, size_t n,
                                           int64_t lo, int64_t hi) {
  for (size_t i = grid_index(); i < n; i += grid_stride()) {
    const int64_t x = v[i];
    if (x < lo || x >= hi) atomicMin(record, static_cast<unsigned long long>(i) << 32 | static_cast<uint32_t>(v[i]));
  }
}

}  // namespace

void record_out_of_range(const Ctx& ctx, unsigned long long* record, const int32_t* v, int64_t n, int64_t lo,
                         int64_t hi) {
  if (n <= 0) return;
  const size_t count = static_cast<size_t>(n);
  record_out_of_range_kernel<<<grid_for(count, kThreads, ctx), kThreads, 0, ctx.stream>>>(record, v, count, lo, hi);
  check_launch("deferred range check");
}

int64_t first_out_of_range(const Ctx& ctx, const int32_t* v, int64_t n, int64_t lo, int64_t hi,
                           int32_t* value) {
  if (n <= 0) return -1;
  auto* first = static_cast<unsigned long long*>(ctx.scratch);
  // All bits set: ULLONG_MAX means "none".
  PIPETRAIN_CUDA_CHECK(cudaMemsetAsync(first, 0xff, sizeof *first, ctx.stream));
  const size_t count = static_cast<size_t>(n);
  first_out_of_range_kernel<<<grid_for(count, kThreads, ctx), kThreads, 0, ctx.stream>>>(
      first, v, count, lo, hi);
  check_launch("range check");
  unsigned long long index = 0;
  PIPETRAIN_CUDA_CHECK(
      cudaMemcpyAsync(&index, first, sizeof index, cudaMemcpyDeviceToHost, ctx.stream));
  PIPETRAIN_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
  if (index == ULLONG_MAX) return -1;
  int32_t bad = 0;
  PIPETRAIN_CUDA_CHECK(
      cudaMemcpyAsync(&bad, v + index, sizeof bad, cudaMemcpyDeviceToHost, ctx.stream));
  PIPETRAIN_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
  if (value != nullptr) *value = bad;
  return static_cast<int64_t>(index);
}

}  // namespace pipetrain::cuda
