// Device-side helpers shared by the CUDA kernel files: grid-stride indexing and
// warp / block reductions. Every reduction has a fixed shape (xor butterflies, then
// warp partials in warp order), so results do not depend on scheduling: the
// kernels are deterministic run to run.
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace pipetrain::cuda {

// First index and stride of a 1-D grid-stride loop.
__device__ __forceinline__ size_t grid_index() {
  return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ size_t grid_stride() {
  return static_cast<size_t>(gridDim.x) * blockDim.x;
}

struct SumOp {
  template <class T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Reduction over the 32 lanes of a warp; every lane gets the result.
template <class T, class Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}
template <class T>
__device__ __forceinline__ T warp_sum(T v) {
  return warp_reduce(v, SumOp{});
}

// Reduction over the whole block (blockDim.x a multiple of 32, at most 1024);
// every thread gets the result. All threads of the block must call it (it
// synchronises); consecutive calls are safe.
template <class T, class Op>
__device__ T block_reduce(T v, Op op, T identity) {
  __shared__ T partial[32];
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  v = warp_reduce(v, op);
  __syncthreads();  // a previous call may still be reading `partial`
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < (blockDim.x >> 5) ? partial[lane] : identity;
  return warp_reduce(v, op);  // every warp reduces the same partials
}
__device__ __forceinline__ float block_sum(float v) { return block_reduce(v, SumOp{}, 0.0f); }
__device__ __forceinline__ double block_sum(double v) { return block_reduce(v, SumOp{}, 0.0); }
__device__ __forceinline__ float block_max(float v) { return block_reduce(v, MaxOp{}, -INFINITY); }

// The first key query t of a sequence sees: core/documents.hpp's first_visible_key on the
// device. pos: that sequence's T positions (packed documents), or null (plain causal: 0).
__device__ __forceinline__ int first_key(const int32_t* pos, int t) { return pos ? t - pos[t] : 0; }

}  // namespace pipetrain::cuda
