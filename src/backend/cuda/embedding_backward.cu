// Token and position embedding, backward side: the scatter-add of dout rows into
// the (possibly vocabulary-sharded) token-embedding gradient, and the position
// gradient. Both are deterministic without atomics or sorting, and add in the same
// order as the CPU backend (token order), so they match it bit for bit.
//
// embedding_scatter: a warp owns 32 columns of every gradient row in one residue
// class (row % classes == g). It walks all tokens in order, 32 at a time (one
// coalesced load and a ballot), and for each token of its class adds the dout row
// segment into that gradient row, keeping the row in a register while consecutive
// tokens of its class repeat it. So every (row, column) is summed by one thread,
// in token order. `classes` spreads rows over enough warps to fill the GPU; a
// warp's serial work is the number of tokens in its class (skewed only when a few
// tokens dominate a batch).
//
// position_backward: one thread per (t, c), adding the B rows in order of b. With packed
// documents (a row's position read from positions), embedding_scatter with the positions as
// tokens over the rows [0, T): every (position, column) summed by one thread in row order,
// as the CPU does.
#include "cuda_device.cuh"
#include "cuda_kernels.hpp"

namespace pipetrain::cuda {
namespace {

constexpr unsigned kThreads = 256;
constexpr int kMaxClasses = 1024;

__global__ void embedding_scatter_kernel(float* dwte, const float* __restrict__ dout,
                                         const int32_t* __restrict__ tokens, int row_begin,
                                         int row_end, int N, int C, int classes) {
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int chunks = (C + 31) / 32;
  if (warp >= static_cast<int64_t>(chunks) * classes) return;  // whole warps leave together
  const int lane = threadIdx.x & 31;
  const int g = static_cast<int>(warp / chunks);
  const int c = static_cast<int>(warp % chunks) * 32 + lane;
  const bool column = c < C;
  int64_t cur = -1;  // gradient row held in acc (the same in every lane)
  float acc = 0.0f;
  for (int n0 = 0; n0 < N; n0 += 32) {
    const int n = n0 + lane;
    const int32_t tok = n < N ? tokens[n] : row_begin - 1;
    const bool mine = tok >= row_begin && tok < row_end && (tok - row_begin) % classes == g;
    unsigned pending = __ballot_sync(0xffffffffu, mine);
    while (pending != 0) {  // uniform across the warp
      const int j = __ffs(pending) - 1;
      pending &= pending - 1;
      const int64_t row = static_cast<int64_t>(__shfl_sync(0xffffffffu, tok, j)) - row_begin;
      if (column) {
        if (row != cur) {
          if (cur >= 0) dwte[cur * C + c] = acc;
          acc = dwte[row * C + c];
          cur = row;
        }
        acc += dout[static_cast<int64_t>(n0 + j) * C + c];
      }
    }
  }
  if (column && cur >= 0) dwte[cur * C + c] = acc;
}

__global__ void position_backward_kernel(float* dwpe, const float* __restrict__ dout, int B, int T,
                                         int C) {
  const size_t total = static_cast<size_t>(T) * C;
  const size_t batch_stride = total;
  for (size_t i = grid_index(); i < total; i += grid_stride()) {
    float acc = dwpe[i];
    for (int b = 0; b < B; ++b) acc += dout[b * batch_stride + i];
    dwpe[i] = acc;
  }
}

}  // namespace

void embedding_scatter(const Ctx& ctx, float* dwte, const float* dout, const int32_t* tokens,
                       int row_begin, int row_end, int N, int C) {
  if (N <= 0 || C <= 0 || row_end <= row_begin) return;
  const int64_t chunks = (C + 31) / 32;
  // About two warps per scheduler slot of the grid cap, at most one class per row.
  const int64_t target_warps = static_cast<int64_t>(ctx.max_blocks) * 2;
  int64_t classes = target_warps / chunks;
  const int64_t rows = static_cast<int64_t>(row_end) - row_begin;
  if (classes > rows) classes = rows;
  if (classes > kMaxClasses) classes = kMaxClasses;
  if (classes < 1) classes = 1;
  const int64_t threads = chunks * classes * 32;
  const unsigned blocks = static_cast<unsigned>((threads + kThreads - 1) / kThreads);
  embedding_scatter_kernel<<<blocks, kThreads, 0, ctx.stream>>>(
      dwte, dout, tokens, row_begin, row_end, N, C, static_cast<int>(classes));
  check_launch("embedding_scatter");
}

void position_backward(const Ctx& ctx, float* dwpe, const float* dout, int B, int T, int C, const int32_t* positions) {
  if (B <= 0 || T <= 0 || C <= 0) return;
  if (positions) return embedding_scatter(ctx, dwpe, dout, positions, 0, T, B * T, C);
  const size_t total = static_cast<size_t>(T) * C;
  position_backward_kernel<<<grid_for(total, kThreads, ctx), kThreads, 0, ctx.stream>>>(
      dwpe, dout, B, T, C);
  check_launch("position_backward");
}

}  // namespace pipetrain::cuda
