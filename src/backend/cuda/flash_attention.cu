// Causal self-attention, flash style: the (T, T) probabilities are never stored. Forward
// keeps each row's log-sum-exp; backward recomputes every probability from it.
//
// One warp per query row (forward, dQ) or key row (dK, dV), eight rows per block; the
// other side streams through shared memory in tiles of 32 rows, one per lane: lane j
// computes the score of row j of the tile, the warp combines the 32 with shuffles.
// Forward is the online softmax (running max m, running sum l, output rescaled when m
// grows); backward is FlashAttention-2's: with D_i = dO_i . O_i,
//   P_ij = exp(s_ij - lse_i), dS_ij = P_ij (dO_i . V_j - D_i),
//   dQ_i = scale sum_j dS_ij K_j,  dK_j = scale sum_i dS_ij Q_i,  dV_j = sum_i P_ij dO_i.
// Every output row is owned by one warp and summed in a fixed order: deterministic, no
// atomics. Head sizes up to 128 (four channels per lane); the backend falls back to the
// probability kernels (attention.cu) above that.
#include "cuda_device.cuh"
#include "cuda_kernels.hpp"

namespace pipetrain::cuda {

namespace {

constexpr int kRows = 8;             // rows per block: one warp each
constexpr int kTile = 32;            // rows per shared-memory tile: one per lane
constexpr int kPad = kMaxFlashHead + 1;  // tile row stride: lane-strided reads hit distinct banks
constexpr int kPerLane = kMaxFlashHead / 32;

__device__ __forceinline__ size_t row_of(int b, int t, int T) { return static_cast<size_t>(b) * T + t; }

// Rows [t0, t0 + kTile) of one part (0 = Q, 1 = K, 2 = V) of head h into tile (zeros past T).
__device__ void load_tile(float (*tile)[kPad], const float* qkv, int part, int b, int h, int t0, int T, int C, int hs) {
  const size_t C3 = 3 * static_cast<size_t>(C);
  for (int e = threadIdx.x; e < kTile * hs; e += blockDim.x) {
    const int r = e / hs, d = e % hs, t = t0 + r;
    tile[r][d] = t < T ? qkv[row_of(b, t, T) * C3 + static_cast<size_t>(part) * C + h * hs + d] : 0.0f;
  }
}
// The same for an (B, T, C) tensor (dO).
__device__ void load_rows(float (*tile)[kPad], const float* x, int b, int h, int t0, int T, int C, int hs) {
  for (int e = threadIdx.x; e < kTile * hs; e += blockDim.x) {
    const int r = e / hs, d = e % hs, t = t0 + r;
    tile[r][d] = t < T ? x[row_of(b, t, T) * C + h * hs + d] : 0.0f;
  }
}

__global__ void flash_forward_kernel(float* out, float* lse, const float* qkv, int T, int C, int NH, float scale) {
  const int hs = C / NH, bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row0 = blockIdx.x * kRows, i = row0 + warp;
  const bool active = i < T;
  __shared__ float ks[kTile][kPad], vs[kTile][kPad], qs[kRows][kMaxFlashHead];
  const size_t C3 = 3 * static_cast<size_t>(C);
  if (active)
    for (int d = lane; d < hs; d += 32) qs[warp][d] = qkv[row_of(b, i, T) * C3 + h * hs + d];
  float m = -INFINITY, l = 0.0f, acc[kPerLane] = {};
  const int last = min(row0 + kRows, T) - 1;  // the block's last query: later keys are masked
  for (int t0 = 0; t0 <= last; t0 += kTile) {
    __syncthreads();  // the previous tile is no longer read
    load_tile(ks, qkv, 1, b, h, t0, T, C, hs);
    load_tile(vs, qkv, 2, b, h, t0, T, C, hs);
    __syncthreads();
    if (!active || t0 > i) continue;  // uniform per warp
    const int j = t0 + lane;
    float s = -INFINITY;
    if (j <= i) {
      float dot = 0.0f;
      for (int d = 0; d < hs; ++d) dot += qs[warp][d] * ks[lane][d];
      s = dot * scale;
    }
    const float m_new = fmaxf(m, warp_reduce(s, MaxOp{}));  // finite: key t0 <= i is in the tile
    const float p = j <= i ? expf(s - m_new) : 0.0f;
    const float corr = expf(m - m_new);  // 0 on the first tile (m = -inf)
    l = l * corr + warp_sum(p);
    for (int r = 0; r < kPerLane; ++r) acc[r] *= corr;
    const int n = min(kTile, i - t0 + 1);
    for (int jj = 0; jj < n; ++jj) {
      const float pj = __shfl_sync(0xffffffffu, p, jj);
      for (int r = 0; r < kPerLane; ++r) {
        const int d = lane + 32 * r;
        if (d < hs) acc[r] += pj * vs[jj][d];
      }
    }
    m = m_new;
  }
  if (!active) return;
  const float inv = 1.0f / l;
  for (int r = 0; r < kPerLane; ++r) {
    const int d = lane + 32 * r;
    if (d < hs) out[row_of(b, i, T) * C + h * hs + d] = acc[r] * inv;
  }
  if (lane == 0) lse[static_cast<size_t>(bh) * T + i] = m + logf(l);
}

// D_i = dO_i . O_i for every (b, h, i): one warp per row.
__global__ void flash_delta_kernel(float* delta, const float* dout, const float* out, int B, int T, int C, int NH) {
  const int hs = C / NH, lane = threadIdx.x & 31;
  const size_t rows = static_cast<size_t>(B) * NH * T;
  const size_t warps = grid_stride() / 32;
  for (size_t w = grid_index() / 32; w < rows; w += warps) {
    const int i = static_cast<int>(w % T), bh = static_cast<int>(w / T), b = bh / NH, h = bh % NH;
    const size_t base = row_of(b, i, T) * C + h * hs;
    float s = 0.0f;
    for (int d = lane; d < hs; d += 32) s += dout[base + d] * out[base + d];
    s = warp_sum(s);
    if (lane == 0) delta[w] = s;
  }
}

// dQ: one warp per query row, key tiles up to the block's last query.
__global__ void flash_dq_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                                const float* delta, int T, int C, int NH, float scale) {
  const int hs = C / NH, bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row0 = blockIdx.x * kRows, i = row0 + warp;
  const bool active = i < T;
  __shared__ float ks[kTile][kPad], vs[kTile][kPad], qs[kRows][kMaxFlashHead], dos[kRows][kMaxFlashHead];
  const size_t C3 = 3 * static_cast<size_t>(C);
  float lse_i = 0.0f, d_i = 0.0f;
  if (active) {
    for (int d = lane; d < hs; d += 32) {
      qs[warp][d] = qkv[row_of(b, i, T) * C3 + h * hs + d];
      dos[warp][d] = dout[row_of(b, i, T) * C + h * hs + d];
    }
    lse_i = lse[static_cast<size_t>(bh) * T + i];
    d_i = delta[static_cast<size_t>(bh) * T + i];
  }
  float acc[kPerLane] = {};
  const int last = min(row0 + kRows, T) - 1;
  for (int t0 = 0; t0 <= last; t0 += kTile) {
    __syncthreads();
    load_tile(ks, qkv, 1, b, h, t0, T, C, hs);
    load_tile(vs, qkv, 2, b, h, t0, T, C, hs);
    __syncthreads();
    if (!active || t0 > i) continue;
    const int j = t0 + lane;
    float ds = 0.0f;
    if (j <= i) {
      float qk = 0.0f, dov = 0.0f;
      for (int d = 0; d < hs; ++d) {
        qk += qs[warp][d] * ks[lane][d];
        dov += dos[warp][d] * vs[lane][d];
      }
      ds = expf(qk * scale - lse_i) * (dov - d_i);
    }
    const int n = min(kTile, i - t0 + 1);
    for (int jj = 0; jj < n; ++jj) {
      const float dsj = __shfl_sync(0xffffffffu, ds, jj);
      for (int r = 0; r < kPerLane; ++r) {
        const int d = lane + 32 * r;
        if (d < hs) acc[r] += dsj * ks[jj][d];
      }
    }
  }
  if (!active) return;
  for (int r = 0; r < kPerLane; ++r) {
    const int d = lane + 32 * r;
    if (d < hs) dqkv[row_of(b, i, T) * C3 + h * hs + d] = acc[r] * scale;
  }
}

// dK and dV: one warp per key row j, query tiles from the block's first key to T.
__global__ void flash_dkv_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                                 const float* delta, int T, int C, int NH, float scale) {
  const int hs = C / NH, bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row0 = blockIdx.x * kRows, j = row0 + warp;
  const bool active = j < T;
  __shared__ float qs[kTile][kPad], dos[kTile][kPad], kr[kRows][kMaxFlashHead], vr[kRows][kMaxFlashHead];
  __shared__ float lse_t[kTile], delta_t[kTile];
  const size_t C3 = 3 * static_cast<size_t>(C);
  if (active)
    for (int d = lane; d < hs; d += 32) {
      kr[warp][d] = qkv[row_of(b, j, T) * C3 + C + h * hs + d];
      vr[warp][d] = qkv[row_of(b, j, T) * C3 + 2 * static_cast<size_t>(C) + h * hs + d];
    }
  float dk[kPerLane] = {}, dv[kPerLane] = {};
  for (int t0 = row0 / kTile * kTile; t0 < T; t0 += kTile) {
    __syncthreads();
    load_tile(qs, qkv, 0, b, h, t0, T, C, hs);
    load_rows(dos, dout, b, h, t0, T, C, hs);
    if (threadIdx.x < kTile) {
      const int t = t0 + static_cast<int>(threadIdx.x);
      lse_t[threadIdx.x] = t < T ? lse[static_cast<size_t>(bh) * T + t] : 0.0f;
      delta_t[threadIdx.x] = t < T ? delta[static_cast<size_t>(bh) * T + t] : 0.0f;
    }
    __syncthreads();
    if (!active || t0 + kTile <= j) continue;  // every query of the tile is before this key
    const int i = t0 + lane;
    float p = 0.0f, ds = 0.0f;
    if (i >= j && i < T) {
      float qk = 0.0f, dov = 0.0f;
      for (int d = 0; d < hs; ++d) {
        qk += qs[lane][d] * kr[warp][d];
        dov += dos[lane][d] * vr[warp][d];
      }
      p = expf(qk * scale - lse_t[lane]);
      ds = p * (dov - delta_t[lane]);
    }
    for (int ii = max(0, j - t0); ii < kTile; ++ii) {
      const float pi = __shfl_sync(0xffffffffu, p, ii), dsi = __shfl_sync(0xffffffffu, ds, ii);
      for (int r = 0; r < kPerLane; ++r) {
        const int d = lane + 32 * r;
        if (d < hs) {
          dv[r] += pi * dos[ii][d];
          dk[r] += dsi * qs[ii][d];
        }
      }
    }
  }
  if (!active) return;
  for (int r = 0; r < kPerLane; ++r) {
    const int d = lane + 32 * r;
    if (d < hs) {
      dqkv[row_of(b, j, T) * C3 + C + h * hs + d] = dk[r] * scale;
      dqkv[row_of(b, j, T) * C3 + 2 * static_cast<size_t>(C) + h * hs + d] = dv[r];
    }
  }
}

dim3 row_grid(int B, int T, int NH) { return dim3(static_cast<unsigned>((T + kRows - 1) / kRows), static_cast<unsigned>(B * NH)); }

}  // namespace

void flash_attention_forward(const Ctx& ctx, float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
  const float scale = 1.0f / sqrtf(static_cast<float>(C / NH));
  flash_forward_kernel<<<row_grid(B, T, NH), kRows * 32, 0, ctx.stream>>>(out, lse, qkv, T, C, NH, scale);
  check_launch("flash_forward_kernel");
}

void flash_attention_backward(const Ctx& ctx, float* dqkv, float* delta, const float* dout, const float* qkv,
                              const float* out, const float* lse, int B, int T, int C, int NH) {
  const float scale = 1.0f / sqrtf(static_cast<float>(C / NH));
  const size_t rows = static_cast<size_t>(B) * NH * T;
  flash_delta_kernel<<<grid_for(rows * 32, 256, ctx), 256, 0, ctx.stream>>>(delta, dout, out, B, T, C, NH);
  check_launch("flash_delta_kernel");
  flash_dq_kernel<<<row_grid(B, T, NH), kRows * 32, 0, ctx.stream>>>(dqkv, dout, qkv, lse, delta, T, C, NH, scale);
  check_launch("flash_dq_kernel");
  flash_dkv_kernel<<<row_grid(B, T, NH), kRows * 32, 0, ctx.stream>>>(dqkv, dout, qkv, lse, delta, T, C, NH, scale);
  check_launch("flash_dkv_kernel");
}

}  // namespace pipetrain::cuda
