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
// Grouped-query attention: query head h reads key/value head h / (NH / NKV) (rows of qkv
// are C + 2 NKV hs wide); a key/value head's gradient sums its group's query heads in
// order. Every output row is owned by one warp and summed in a fixed order: deterministic,
// no atomics. Head sizes up to 128 (four channels per lane); the backend falls back to the
// probability kernels (attention.cu) above that.
// Packed documents (core/documents.hpp): query i sees keys [first_i, i] only. A score
// before first_i is never computed (probability 0), a block starts at the key tile of its
// rows' earliest first key, and a warp skips the tiles wholly before its row's.
#include "cuda_device.cuh"
#include "cuda_kernels.hpp"

namespace pipetrain::cuda {

namespace {

constexpr int kRows = 8;             // rows per block: one warp each
constexpr int kTile = 32;            // rows per shared-memory tile: one per lane
constexpr int kPad = kMaxFlashHead + 1;  // tile row stride: lane-strided reads hit distinct banks
constexpr int kPerLane = kMaxFlashHead / 32;

__device__ __forceinline__ size_t row_of(int b, int t, int T) { return static_cast<size_t>(b) * T + t; }

// Rows [t0, t0 + kTile) of channels [col, col + hs) of a (B, T, ld) tensor into tile
// (zeros past T).
__device__ void load_tile(float (*tile)[kPad], const float* x, size_t ld, size_t col, int b, int t0, int T, int hs) {
  for (int e = threadIdx.x; e < kTile * hs; e += blockDim.x) {
    const int r = e / hs, d = e % hs, t = t0 + r;
    tile[r][d] = t < T ? x[row_of(b, t, T) * ld + col + d] : 0.0f;
  }
}

// Sequence b's positions, or null (plain causal).
__device__ __forceinline__ const int32_t* sequence_positions(const int32_t* positions, int b, int T) {
  return positions ? positions + row_of(b, 0, T) : nullptr;
}

// The first key tile the query rows [row0, row0 + kRows) need: the one holding their
// earliest first key (0 without positions; never before key 0, whatever the positions).
__device__ int first_key_tile(const int32_t* pos, int row0, int T) {
  if (!pos) return 0;
  int lo = row0;
  for (int r = 0; r < kRows && row0 + r < T; ++r) lo = min(lo, first_key(pos, row0 + r));
  return max(lo, 0) / kTile * kTile;
}

// Where the parts of query head h start in a qkv row (K and V: its key/value head's).
struct Heads {
  int C, NH, NKV, hs;
  __device__ size_t ld() const { return static_cast<size_t>(C) + 2 * static_cast<size_t>(NKV) * hs; }
  __device__ size_t q(int h) const { return static_cast<size_t>(h) * hs; }
  __device__ size_t k_of_kv(int hk) const { return static_cast<size_t>(C) + static_cast<size_t>(hk) * hs; }
  __device__ size_t v_of_kv(int hk) const { return k_of_kv(hk) + static_cast<size_t>(NKV) * hs; }
  __device__ int kv(int h) const { return h / (NH / NKV); }
};

__global__ void flash_forward_kernel(float* out, float* lse, const float* qkv, const int32_t* positions, int T, Heads H,
                                     float scale) {
  const int hs = H.hs, C = H.C, NH = H.NH, bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row0 = blockIdx.x * kRows, i = row0 + warp;
  const bool active = i < T;
  const int32_t* pos = sequence_positions(positions, b, T);
  const int first = active ? first_key(pos, i) : 0;  // the row's first visible key
  __shared__ float ks[kTile][kPad], vs[kTile][kPad], qs[kRows][kMaxFlashHead];
  const size_t ld = H.ld();
  if (active)
    for (int d = lane; d < hs; d += 32) qs[warp][d] = qkv[row_of(b, i, T) * ld + H.q(h) + d];
  float m = -INFINITY, l = 0.0f, acc[kPerLane] = {};
  const int last = min(row0 + kRows, T) - 1;  // the block's last query: later keys are masked
  for (int t0 = first_key_tile(pos, row0, T); t0 <= last; t0 += kTile) {
    __syncthreads();  // the previous tile is no longer read
    load_tile(ks, qkv, ld, H.k_of_kv(H.kv(h)), b, t0, T, hs);
    load_tile(vs, qkv, ld, H.v_of_kv(H.kv(h)), b, t0, T, hs);
    __syncthreads();
    if (!active || t0 > i || t0 + kTile <= first) continue;  // uniform per warp
    const int j = t0 + lane;
    const bool seen = j >= first && j <= i;
    float s = -INFINITY;
    if (seen) {
      float dot = 0.0f;
      for (int d = 0; d < hs; ++d) dot += qs[warp][d] * ks[lane][d];
      s = dot * scale;
    }
    // Finite: key max(t0, first) <= i is in the tile (an earlier tile would have been skipped).
    const float m_new = fmaxf(m, warp_reduce(s, MaxOp{}));
    const float p = seen ? expf(s - m_new) : 0.0f;
    const float corr = expf(m - m_new);  // 0 on the row's first tile (m = -inf)
    l = l * corr + warp_sum(p);
    for (int r = 0; r < kPerLane; ++r) acc[r] *= corr;
    const int n = min(kTile, i - t0 + 1);
    for (int jj = max(0, first - t0); jj < n; ++jj) {
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
__global__ void flash_dq_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* delta,
                                const int32_t* positions, int T, Heads H, float scale) {
  const int hs = H.hs, C = H.C, NH = H.NH, bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row0 = blockIdx.x * kRows, i = row0 + warp;
  const bool active = i < T;
  const int32_t* pos = sequence_positions(positions, b, T);
  const int first = active ? first_key(pos, i) : 0;  // the row's first visible key
  __shared__ float ks[kTile][kPad], vs[kTile][kPad], qs[kRows][kMaxFlashHead], dos[kRows][kMaxFlashHead];
  const size_t ld = H.ld();
  float lse_i = 0.0f, d_i = 0.0f;
  if (active) {
    for (int d = lane; d < hs; d += 32) {
      qs[warp][d] = qkv[row_of(b, i, T) * ld + H.q(h) + d];
      dos[warp][d] = dout[row_of(b, i, T) * C + h * hs + d];
    }
    lse_i = lse[static_cast<size_t>(bh) * T + i];
    d_i = delta[static_cast<size_t>(bh) * T + i];
  }
  float acc[kPerLane] = {};
  const int last = min(row0 + kRows, T) - 1;
  for (int t0 = first_key_tile(pos, row0, T); t0 <= last; t0 += kTile) {
    __syncthreads();
    load_tile(ks, qkv, ld, H.k_of_kv(H.kv(h)), b, t0, T, hs);
    load_tile(vs, qkv, ld, H.v_of_kv(H.kv(h)), b, t0, T, hs);
    __syncthreads();
    if (!active || t0 > i || t0 + kTile <= first) continue;  // uniform per warp
    const int j = t0 + lane;
    float ds = 0.0f;
    if (j >= first && j <= i) {
      float qk = 0.0f, dov = 0.0f;
      for (int d = 0; d < hs; ++d) {
        qk += qs[warp][d] * ks[lane][d];
        dov += dos[warp][d] * vs[lane][d];
      }
      ds = expf(qk * scale - lse_i) * (dov - d_i);
    }
    const int n = min(kTile, i - t0 + 1);
    for (int jj = max(0, first - t0); jj < n; ++jj) {
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
    if (d < hs) dqkv[row_of(b, i, T) * ld + H.q(h) + d] = acc[r] * scale;
  }
}

// dK and dV: one warp per key row j of key/value head hk, summing the group's query heads
// in order, each over its query tiles from the block's first key to T (with positions,
// less the tiles none of whose queries sees a key of the block).
__global__ void flash_dkv_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* delta,
                                 const int32_t* positions, int T, Heads H, float scale) {
  const int hs = H.hs, C = H.C, NKV = H.NKV, group = H.NH / H.NKV;
  const int bk = blockIdx.y, b = bk / NKV, hk = bk % NKV;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row0 = blockIdx.x * kRows, j = row0 + warp;
  const bool active = j < T;
  const int32_t* pos = sequence_positions(positions, b, T);
  const int jmax = min(row0 + kRows, T) - 1;  // the block's last key
  __shared__ float qs[kTile][kPad], dos[kTile][kPad], kr[kRows][kMaxFlashHead], vr[kRows][kMaxFlashHead];
  __shared__ float lse_t[kTile], delta_t[kTile];
  const size_t ld = H.ld();
  if (active)
    for (int d = lane; d < hs; d += 32) {
      kr[warp][d] = qkv[row_of(b, j, T) * ld + H.k_of_kv(hk) + d];
      vr[warp][d] = qkv[row_of(b, j, T) * ld + H.v_of_kv(hk) + d];
    }
  float dk[kPerLane] = {}, dv[kPerLane] = {};
  for (int g = 0; g < group; ++g) {
    const int h = hk * group + g, bh = b * H.NH + h;
    for (int t0 = row0 / kTile * kTile; t0 < T; t0 += kTile) {
      const int i = t0 + lane;
      const int first = i < T ? first_key(pos, i) : T;  // query i's first visible key (T: no query)
      // The same answer in every warp, so the whole block skips the tile or none of it.
      if (pos && !__any_sync(0xffffffffu, i >= row0 && first <= jmax)) continue;
      __syncthreads();
      load_tile(qs, qkv, ld, H.q(h), b, t0, T, hs);
      load_tile(dos, dout, static_cast<size_t>(C), static_cast<size_t>(h) * hs, b, t0, T, hs);
      if (threadIdx.x < kTile) {
        const int t = t0 + static_cast<int>(threadIdx.x);
        lse_t[threadIdx.x] = t < T ? lse[static_cast<size_t>(bh) * T + t] : 0.0f;
        delta_t[threadIdx.x] = t < T ? delta[static_cast<size_t>(bh) * T + t] : 0.0f;
      }
      __syncthreads();
      if (!active || t0 + kTile <= j) continue;  // every query of the tile is before this key
      float p = 0.0f, ds = 0.0f;
      if (i >= j && i < T && first <= j) {
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
  }
  if (!active) return;
  for (int r = 0; r < kPerLane; ++r) {
    const int d = lane + 32 * r;
    if (d < hs) {
      dqkv[row_of(b, j, T) * ld + H.k_of_kv(hk) + d] = dk[r] * scale;
      dqkv[row_of(b, j, T) * ld + H.v_of_kv(hk) + d] = dv[r];
    }
  }
}

dim3 row_grid(int B, int T, int heads) {
  return dim3(static_cast<unsigned>((T + kRows - 1) / kRows), static_cast<unsigned>(B * heads));
}

}  // namespace

void flash_attention_forward(const Ctx& ctx, float* out, float* lse, const float* qkv, int B, int T, int C, int NH,
                             int NKV, const int32_t* positions) {
  if (B <= 0 || T <= 0) return;  // no rows: an empty grid is an invalid launch
  const Heads H{C, NH, NKV, C / NH};
  const float scale = 1.0f / sqrtf(static_cast<float>(H.hs));
  flash_forward_kernel<<<row_grid(B, T, NH), kRows * 32, 0, ctx.stream>>>(out, lse, qkv, positions, T, H, scale);
  check_launch("flash_forward_kernel");
}

void flash_attention_backward(const Ctx& ctx, float* dqkv, float* delta, const float* dout, const float* qkv,
                              const float* out, const float* lse, int B, int T, int C, int NH, int NKV,
                              const int32_t* positions) {
  if (B <= 0 || T <= 0) return;
  const Heads H{C, NH, NKV, C / NH};
  const float scale = 1.0f / sqrtf(static_cast<float>(H.hs));
  const size_t rows = static_cast<size_t>(B) * NH * T;
  flash_delta_kernel<<<grid_for(rows * 32, 256, ctx), 256, 0, ctx.stream>>>(delta, dout, out, B, T, C, NH);
  check_launch("flash_delta_kernel");
  flash_dq_kernel<<<row_grid(B, T, NH), kRows * 32, 0, ctx.stream>>>(dqkv, dout, qkv, lse, delta, positions, T, H,
                                                                     scale);
  check_launch("flash_dq_kernel");
  flash_dkv_kernel<<<row_grid(B, T, NKV), kRows * 32, 0, ctx.stream>>>(dqkv, dout, qkv, lse, delta, positions, T, H,
                                                                       scale);
  check_launch("flash_dkv_kernel");
}

}  // namespace pipetrain::cuda
