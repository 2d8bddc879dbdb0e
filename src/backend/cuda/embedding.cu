// Token and position embedding, forward side (gathers, one thread per output
// element): embedding_forward, the vocabulary-sharded embedding_lookup and
// position_add (from an f32 table, or a bf16 one widened exactly; row b*T + t at position
// t, or positions[b*T + t] with packed documents). The backend checked the tokens of
// embedding_forward (>= 0).
#include "cuda_device.cuh"
#include "cuda_kernels.hpp"

namespace pipetrain::cuda {
namespace {

constexpr unsigned kThreads = 256;

__global__ void embedding_forward_kernel(float* out, const int32_t* __restrict__ tokens,
                                         const float* __restrict__ wte,
                                         const float* __restrict__ wpe, int T, int C,
                                         size_t total) {
  for (size_t i = grid_index(); i < total; i += grid_stride()) {
    const size_t n = i / C, c = i % C;
    // A negative token (reported by the deferred check after the step) reads no row.
    const int32_t tok = tokens[n];
    out[i] = (tok >= 0 ? wte[static_cast<size_t>(tok) * C + c] : 0.0f) + wpe[(n % T) * C + c];
  }
}

__device__ inline float widen(float x) { return x; }
__device__ inline float widen(uint16_t x) { return __uint_as_float(static_cast<uint32_t>(x) << 16); }

template <class W>
__global__ void embedding_lookup_kernel(float* out, const int32_t* __restrict__ tokens,
                                        const W* __restrict__ wte, int row_begin, int row_end,
                                        int C, size_t total) {
  for (size_t i = grid_index(); i < total; i += grid_stride()) {
    const size_t n = i / C, c = i % C;
    const int32_t tok = tokens[n];
    out[i] = tok >= row_begin && tok < row_end
                 ? widen(wte[static_cast<size_t>(tok - row_begin) * C + c])
                 : 0.0f;
  }
}

template <class W>
__global__ void position_add_kernel(float* out, const W* __restrict__ wpe, const int32_t* __restrict__ positions, int T,
                                    int C, size_t total) {
  for (size_t i = grid_index(); i < total; i += grid_stride()) {
    const size_t n = i / C, c = i % C;
    const size_t p = positions ? static_cast<size_t>(positions[n]) : n % T;
    out[i] += widen(wpe[p * C + c]);
  }
}

template <class W>
void lookup(const Ctx& ctx, float* out, const int32_t* tokens, const W* wte, int row_begin,
            int row_end, int N, int C) {
  if (N <= 0 || C <= 0) return;
  const size_t total = static_cast<size_t>(N) * C;
  embedding_lookup_kernel<<<grid_for(total, kThreads, ctx), kThreads, 0, ctx.stream>>>(
      out, tokens, wte, row_begin, row_end, C, total);
  check_launch("embedding_lookup");
}

template <class W>
void add_positions(const Ctx& ctx, float* out, const W* wpe, int B, int T, int C, const int32_t* positions) {
  if (B <= 0 || T <= 0 || C <= 0) return;
  const size_t total = static_cast<size_t>(B) * T * C;
  position_add_kernel<<<grid_for(total, kThreads, ctx), kThreads, 0, ctx.stream>>>(out, wpe, positions, T, C, total);
  check_launch("position_add");
}

}  // namespace

void embedding_forward(const Ctx& ctx, float* out, const int32_t* tokens, const float* wte,
                       const float* wpe, int B, int T, int C) {
  const size_t total = static_cast<size_t>(B) * T * C;
  if (B <= 0 || T <= 0 || C <= 0) return;
  embedding_forward_kernel<<<grid_for(total, kThreads, ctx), kThreads, 0, ctx.stream>>>(
      out, tokens, wte, wpe, T, C, total);
  check_launch("embedding_forward");
}

void embedding_lookup(const Ctx& ctx, float* out, const int32_t* tokens, const float* wte,
                      int row_begin, int row_end, int N, int C) {
  lookup(ctx, out, tokens, wte, row_begin, row_end, N, C);
}

void embedding_lookup(const Ctx& ctx, float* out, const int32_t* tokens, const uint16_t* wte,
                      int row_begin, int row_end, int N, int C) {
  lookup(ctx, out, tokens, wte, row_begin, row_end, N, C);
}

void position_add(const Ctx& ctx, float* out, const float* wpe, int B, int T, int C, const int32_t* positions) {
  add_positions(ctx, out, wpe, B, T, C, positions);
}

void position_add(const Ctx& ctx, float* out, const uint16_t* wpe, int B, int T, int C, const int32_t* positions) {
  add_positions(ctx, out, wpe, B, T, C, positions);
}

}  // namespace pipetrain::cuda
