// Attention of queries against one block of keys and values with global positions, flash
// style (context parallelism's ring, model/ring_attention.hpp; the CPU's form is
// backend/cpu/attention_block.cpp): the forward gives the block's output normalized within
// the block and the log-sum-exp of its visible scores, which the ring merges block by
// block; the backward recomputes each block's probabilities from the merged log-sum-exp
// (exp(S - lse): nothing of Tq x Tk is kept) and adds to dQ and the block's dK and dV.
//
// The kernels of flash_attention.cu with positions instead of indices: one warp per query
// row (forward, dQ) or key row (dK, dV), eight rows per block; the other side streams
// through shared memory in tiles of 32 rows, one per lane, the warp combining the 32 with
// shuffles. Key j is visible to query i iff qstart_i <= kpos_j <= qpos_i; keys need not be
// sorted, so every tile is voted on: the block loads it only when one of its rows sees one
// of its keys (__syncthreads_or), a warp computes on it only when its row does. Forward is
// the online softmax; backward is FlashAttention-2's with the merged lse and D_i = dO_i . O_i:
//   P_ij = exp(s_ij - lse_i), dS_ij = P_ij (dO_i . V_j - D_i),
//   dQ_i += scale sum_j dS_ij K_j,  dK_j += scale sum_i dS_ij Q_i,  dV_j += sum_i P_ij dO_i.
// Grouped-query attention: query head h reads key/value head h / (NH / NKV); a key/value
// row's gradient sums its group's query heads and query tiles in order. Every output row is
// owned by one warp and summed in a fixed order: deterministic, no atomics. Head sizes up
// to kMaxBlockHead; the tiles live in dynamic shared memory sized by the head (rows padded
// to an odd stride: lane-strided reads hit distinct banks), opted in above 48 KiB.
#include "cuda_device.cuh"
#include "cuda_kernels.hpp"

namespace pipetrain::cuda {

namespace {

constexpr int kRows = 8;                      // rows per block: one warp each
constexpr int kTile = 32;                     // rows per shared-memory tile: one per lane
constexpr int kPerLane = kMaxBlockHead / 32;  // channels per lane: d = lane + 32 r
constexpr unsigned kFull = 0xffffffffu;
constexpr size_t kDefaultShared = 48 * 1024;  // dynamic shared memory without opting in

// A tile's row stride: at least hs and odd.
__host__ __device__ constexpr int padded(int hs) { return hs | 1; }

// The sizes every kernel takes, and where its rows are.
struct Shape {
  int Tq, Tk, NH, NKV, hs;
  float scale;
  __device__ int kv(int h) const { return h / (NH / NKV); }
  __device__ size_t qrow(int b, int i) const { return static_cast<size_t>(b) * Tq + i; }
  __device__ size_t krow(int b, int j) const { return static_cast<size_t>(b) * Tk + j; }
  __device__ size_t lse_at(int b, int h, int i) const { return (static_cast<size_t>(b) * NH + h) * Tq + i; }
};

// The key positions a query sees: [lo, hi] (lo > hi: none).
struct Seen {
  int32_t lo = 1, hi = 0;
  __device__ bool operator()(int32_t kp) const { return kp >= lo && kp <= hi; }
};

// The positions of the queries (qstart: null for 0) and keys, by row.
struct Positions {
  const int32_t *q, *start, *k;
  __device__ Seen of_query(size_t row) const { return {start ? start[row] : 0, q[row]}; }
};

// Rows [t0, t0 + kTile) of channels [col, col + hs) of x (row r at x + (base + r) ld) into
// tile (row stride padded(hs)), zeros from row `end` on.
__device__ void load_tile(float* tile, const float* x, size_t ld, size_t col, size_t base, int t0, int end, int hs) {
  const int stride = padded(hs);
  for (int e = threadIdx.x; e < kTile * hs; e += blockDim.x) {
    const int r = e / hs, d = e % hs, t = t0 + r;
    tile[r * stride + d] = t < end ? x[(base + t) * ld + col + d] : 0.0f;
  }
}

// A warp's row of channels [col, col + hs) of x into row (hs floats).
__device__ void load_row(float* row, const float* x, size_t ld, size_t col, size_t at, int hs) {
  for (int d = threadIdx.x & 31; d < hs; d += 32) row[d] = x[at * ld + col + d];
}

// sum_d a[d] b[d] over hs channels (one lane's dot product).
__device__ __forceinline__ float dot(const float* a, const float* b, int hs) {
  float s = 0.0f;
  for (int d = 0; d < hs; ++d) s += a[d] * b[d];
  return s;
}

// acc[r] += w(jj) row_jj[lane + 32 r] for the n rows of a tile, w(jj) lane jj's w.
__device__ __forceinline__ void add_rows(float (&acc)[kPerLane], float w, const float* tile, int n, int hs) {
  const int lane = threadIdx.x & 31, stride = padded(hs);
  for (int jj = 0; jj < n; ++jj) {
    const float wj = __shfl_sync(kFull, w, jj);
#pragma unroll
    for (int r = 0; r < kPerLane; ++r) {
      const int d = lane + 32 * r;
      if (d < hs) acc[r] += wj * tile[jj * stride + d];
    }
  }
}

// dst[lane + 32 r] (+)= acc[r] * s: a warp's output row.
__device__ __forceinline__ void store_row(float* dst, const float (&acc)[kPerLane], float s, int hs, bool add) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < kPerLane; ++r) {
    const int d = lane + 32 * r;
    if (d < hs) dst[d] = (add ? dst[d] : 0.0f) + acc[r] * s;
  }
}

// One warp per query row i of head h: the online softmax over the key tiles it sees.
// Shared: K and V tiles (kTile x padded(hs) each), the block's query rows (kRows x hs).
__global__ void block_forward_kernel(float* out, float* lse, const float* q, int ldq, const float* k, const float* v,
                                     int ldkv, Positions pos, Shape S) {
  extern __shared__ float smem[];
  const int hs = S.hs, stride = padded(hs), b = blockIdx.y / S.NH, h = blockIdx.y % S.NH;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, i = blockIdx.x * kRows + warp;
  float *ks = smem, *vs = ks + kTile * stride, *qs = vs + kTile * stride + warp * hs;
  const bool active = i < S.Tq;
  const Seen sees = active ? pos.of_query(S.qrow(b, i)) : Seen{};
  if (active) load_row(qs, q, ldq, static_cast<size_t>(h) * hs, S.qrow(b, i), hs);
  const size_t kcol = static_cast<size_t>(S.kv(h)) * hs;
  float m = -INFINITY, l = 0.0f, acc[kPerLane] = {};
  for (int t0 = 0; t0 < S.Tk; t0 += kTile) {
    const int j = t0 + lane;
    const bool seen = j < S.Tk && sees(pos.k[S.krow(b, j)]);
    // Also the barrier after which the previous tile (and at first qs) is read no more.
    if (!__syncthreads_or(seen)) continue;
    load_tile(ks, k, ldkv, kcol, S.krow(b, 0), t0, S.Tk, hs);
    load_tile(vs, v, ldkv, kcol, S.krow(b, 0), t0, S.Tk, hs);
    __syncthreads();
    if (!__any_sync(kFull, seen)) continue;  // uniform per warp
    const float s = seen ? dot(qs, ks + lane * stride, hs) * S.scale : -INFINITY;
    const float m_new = fmaxf(m, warp_reduce(s, MaxOp{}));  // finite: a lane sees its key
    const float p = seen ? expf(s - m_new) : 0.0f;
    const float corr = expf(m - m_new);  // 0 on the row's first tile (m = -inf)
    l = l * corr + warp_sum(p);
#pragma unroll
    for (int r = 0; r < kPerLane; ++r) acc[r] *= corr;
    add_rows(acc, p, vs, min(kTile, S.Tk - t0), hs);
    m = m_new;
  }
  if (!active) return;
  store_row(out + S.qrow(b, i) * S.NH * hs + static_cast<size_t>(h) * hs, acc, l > 0.0f ? 1.0f / l : 0.0f, hs, false);
  if (lane == 0) lse[S.lse_at(b, h, i)] = l > 0.0f ? m + logf(l) : -INFINITY;
}

// dQ: one warp per query row i of head h, over the key tiles it sees.
// Shared: K and V tiles (kTile x padded(hs) each), the block's Q and dO rows (kRows x hs each).
__global__ void block_dq_kernel(float* dq, int lddq, const float* dout, const float* delta, const float* lse,
                                const float* q, int ldq, const float* k, const float* v, int ldkv, Positions pos,
                                Shape S) {
  extern __shared__ float smem[];
  const int hs = S.hs, stride = padded(hs), b = blockIdx.y / S.NH, h = blockIdx.y % S.NH;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, i = blockIdx.x * kRows + warp;
  float *ks = smem, *vs = ks + kTile * stride, *qs = vs + kTile * stride + warp * hs, *dos = qs + kRows * hs;
  const bool active = i < S.Tq;
  const float lse_i = active ? lse[S.lse_at(b, h, i)] : -INFINITY, d_i = active ? delta[S.lse_at(b, h, i)] : 0.0f;
  // A row whose merged lse is -inf saw no key anywhere: it has no gradient.
  const Seen sees = lse_i != -INFINITY ? pos.of_query(S.qrow(b, i)) : Seen{};
  if (active) {
    load_row(qs, q, ldq, static_cast<size_t>(h) * hs, S.qrow(b, i), hs);
    load_row(dos, dout, static_cast<size_t>(S.NH) * hs, static_cast<size_t>(h) * hs, S.qrow(b, i), hs);
  }
  const size_t kcol = static_cast<size_t>(S.kv(h)) * hs;
  float acc[kPerLane] = {};
  for (int t0 = 0; t0 < S.Tk; t0 += kTile) {
    const int j = t0 + lane;
    const bool seen = j < S.Tk && sees(pos.k[S.krow(b, j)]);
    if (!__syncthreads_or(seen)) continue;
    load_tile(ks, k, ldkv, kcol, S.krow(b, 0), t0, S.Tk, hs);
    load_tile(vs, v, ldkv, kcol, S.krow(b, 0), t0, S.Tk, hs);
    __syncthreads();
    if (!__any_sync(kFull, seen)) continue;
    float ds = 0.0f;
    if (seen) {
      const float p = expf(dot(qs, ks + lane * stride, hs) * S.scale - lse_i);
      ds = p * (dot(dos, vs + lane * stride, hs) - d_i);
    }
    add_rows(acc, ds, ks, min(kTile, S.Tk - t0), hs);
  }
  if (active) store_row(dq + S.qrow(b, i) * lddq + static_cast<size_t>(h) * hs, acc, S.scale, hs, true);
}

// dK and dV: one warp per key row j of key/value head hk, summing the group's query heads,
// each over the query tiles that see a key of the block's rows.
// Shared: Q and dO tiles (kTile x padded(hs) each), the block's K and V rows (kRows x hs
// each), the tile's lse and delta (kTile each).
__global__ void block_dkv_kernel(float* dk, float* dv, int lddkv, const float* dout, const float* delta,
                                 const float* lse, const float* q, int ldq, const float* k, const float* v, int ldkv,
                                 Positions pos, Shape S) {
  extern __shared__ float smem[];
  const int hs = S.hs, stride = padded(hs), group = S.NH / S.NKV, b = blockIdx.y / S.NKV, hk = blockIdx.y % S.NKV;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, j = blockIdx.x * kRows + warp;
  float *qs = smem, *dos = qs + kTile * stride, *kr = dos + kTile * stride + warp * hs, *vr = kr + kRows * hs;
  float *lse_t = dos + kTile * stride + 2 * kRows * hs, *delta_t = lse_t + kTile;
  const bool active = j < S.Tk;
  const int32_t kp = active ? pos.k[S.krow(b, j)] : 0;
  const size_t kcol = static_cast<size_t>(hk) * hs, ldo = static_cast<size_t>(S.NH) * hs;
  if (active) {
    load_row(kr, k, ldkv, kcol, S.krow(b, j), hs);
    load_row(vr, v, ldkv, kcol, S.krow(b, j), hs);
  }
  float dk_acc[kPerLane] = {}, dv_acc[kPerLane] = {};
  for (int t0 = 0; t0 < S.Tq; t0 += kTile) {
    const int i = t0 + lane, n = min(kTile, S.Tq - t0);
    const bool seen = active && i < S.Tq && pos.of_query(S.qrow(b, i))(kp);
    if (!__syncthreads_or(seen)) continue;  // the same for every head of the group
    for (int g = 0; g < group; ++g) {
      const int h = hk * group + g;
      if (g > 0) __syncthreads();  // the previous head's tile is read no more
      load_tile(qs, q, ldq, static_cast<size_t>(h) * hs, S.qrow(b, 0), t0, S.Tq, hs);
      load_tile(dos, dout, ldo, static_cast<size_t>(h) * hs, S.qrow(b, 0), t0, S.Tq, hs);
      if (threadIdx.x < kTile) {
        const int t = t0 + static_cast<int>(threadIdx.x);
        lse_t[threadIdx.x] = t < S.Tq ? lse[S.lse_at(b, h, t)] : -INFINITY;
        delta_t[threadIdx.x] = t < S.Tq ? delta[S.lse_at(b, h, t)] : 0.0f;
      }
      __syncthreads();
      if (!__any_sync(kFull, seen)) continue;  // uniform per warp
      float p = 0.0f, ds = 0.0f;
      if (seen && lse_t[lane] != -INFINITY) {
        p = expf(dot(qs + lane * stride, kr, hs) * S.scale - lse_t[lane]);
        ds = p * (dot(dos + lane * stride, vr, hs) - delta_t[lane]);
      }
      add_rows(dv_acc, p, dos, n, hs);
      add_rows(dk_acc, ds, qs, n, hs);
    }
  }
  if (!active) return;
  store_row(dk + S.krow(b, j) * lddkv + kcol, dk_acc, S.scale, hs, true);
  store_row(dv + S.krow(b, j) * lddkv + kcol, dv_acc, 1.0f, hs, true);
}

// One warp per (b, h, t) row of lse: out's row of head h and lse merged with the block's.
__global__ void merge_kernel(float* out, float* lse, const float* block_out, const float* block_lse, int B, int T,
                             int NH, int hs) {
  const int lane = threadIdx.x & 31;
  const size_t rows = static_cast<size_t>(B) * NH * T, warps = grid_stride() / 32;
  for (size_t w = grid_index() / 32; w < rows; w += warps) {
    // Lane 0 reads both before any lane writes (the shuffles order them).
    const float a = __shfl_sync(kFull, lane == 0 ? lse[w] : 0.0f, 0);
    const float c = __shfl_sync(kFull, lane == 0 ? block_lse[w] : 0.0f, 0);
    if (c == -INFINITY) continue;  // the block has nothing this row may see
    const size_t t = w % T, bh = w / T, base = (bh / NH * T + t) * NH * hs + bh % NH * hs;
    const float m = fmaxf(a, c), wa = a == -INFINITY ? 0.0f : expf(a - m), wc = expf(c - m), sum = wa + wc;
    for (int d = lane; d < hs; d += 32)  // a row that saw nothing yet takes the block's as it is
      out[base + d] = a == -INFINITY ? block_out[base + d] : (wa * out[base + d] + wc * block_out[base + d]) / sum;
    if (lane == 0) lse[w] = m + logf(sum);
  }
}

// delta[(b, h, t)] = dout . out over head h's channels of row (b, t): one warp per row.
__global__ void delta_kernel(float* delta, const float* dout, const float* out, int B, int T, int NH, int hs) {
  const int lane = threadIdx.x & 31;
  const size_t rows = static_cast<size_t>(B) * NH * T, warps = grid_stride() / 32;
  for (size_t w = grid_index() / 32; w < rows; w += warps) {
    const size_t t = w % T, bh = w / T, base = (bh / NH * T + t) * NH * hs + bh % NH * hs;
    float s = 0.0f;
    for (int d = lane; d < hs; d += 32) s += dout[base + d] * out[base + d];
    s = warp_sum(s);
    if (lane == 0) delta[w] = s;
  }
}

// Bytes of shared memory of a kernel with `tiles` tiles and `rows` per-warp rows of heads
// of hs, plus `extra` floats; the kernel opted in to them when past the default.
template <class Kernel>
size_t shared_bytes(Kernel kernel, int tiles, int rows, int extra, int hs) {
  const size_t floats = static_cast<size_t>(tiles) * kTile * padded(hs) + static_cast<size_t>(rows) * kRows * hs;
  const size_t bytes = (floats + static_cast<size_t>(extra)) * sizeof(float);
  if (bytes > kDefaultShared)
    PIPETRAIN_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  return bytes;
}

Shape shape_of(int Tq, int Tk, int NH, int NKV, int hs) {
  return {Tq, Tk, NH, NKV, hs, 1.0f / sqrtf(static_cast<float>(hs))};
}

dim3 row_grid(int B, int rows, int heads) {
  return dim3(static_cast<unsigned>((rows + kRows - 1) / kRows), static_cast<unsigned>(B * heads));
}

}  // namespace

void attention_block_forward(const Ctx& ctx, float* out, float* lse, const float* q, int ldq, const float* k,
                             const float* v, int ldkv, const int32_t* qpos, const int32_t* qstart, const int32_t* kpos,
                             int B, int Tq, int Tk, int NH, int NKV, int hs) {
  if (B <= 0 || Tq <= 0) return;  // Tk = 0 still writes every row: 0, lse -inf
  const size_t shared = shared_bytes(block_forward_kernel, 2, 1, 0, hs);
  block_forward_kernel<<<row_grid(B, Tq, NH), kRows * 32, shared, ctx.stream>>>(
      out, lse, q, ldq, k, v, ldkv, Positions{qpos, qstart, kpos}, shape_of(Tq, Tk, NH, NKV, hs));
  check_launch("block_forward_kernel");
}

void attention_merge(const Ctx& ctx, float* out, float* lse, const float* block_out, const float* block_lse, int B,
                     int T, int NH, int hs) {
  if (B <= 0 || T <= 0 || NH <= 0) return;
  const size_t rows = static_cast<size_t>(B) * T * NH;
  merge_kernel<<<grid_for(rows * 32, 256, ctx), 256, 0, ctx.stream>>>(out, lse, block_out, block_lse, B, T, NH, hs);
  check_launch("merge_kernel");
}

void attention_delta(const Ctx& ctx, float* delta, const float* dout, const float* out, int B, int T, int NH, int hs) {
  if (B <= 0 || T <= 0 || NH <= 0) return;
  const size_t rows = static_cast<size_t>(B) * T * NH;
  delta_kernel<<<grid_for(rows * 32, 256, ctx), 256, 0, ctx.stream>>>(delta, dout, out, B, T, NH, hs);
  check_launch("delta_kernel");
}

void attention_block_backward(const Ctx& ctx, float* dq, int lddq, float* dk, float* dv, int lddkv, const float* dout,
                              const float* delta, const float* lse, const float* q, int ldq, const float* k,
                              const float* v, int ldkv, const int32_t* qpos, const int32_t* qstart, const int32_t* kpos,
                              int B, int Tq, int Tk, int NH, int NKV, int hs) {
  if (B <= 0 || Tq <= 0 || Tk <= 0) return;  // nothing to add
  const Positions pos{qpos, qstart, kpos};
  const Shape S = shape_of(Tq, Tk, NH, NKV, hs);
  const size_t dq_shared = shared_bytes(block_dq_kernel, 2, 2, 0, hs);
  block_dq_kernel<<<row_grid(B, Tq, NH), kRows * 32, dq_shared, ctx.stream>>>(dq, lddq, dout, delta, lse, q, ldq, k, v,
                                                                              ldkv, pos, S);
  check_launch("block_dq_kernel");
  const size_t dkv_shared = shared_bytes(block_dkv_kernel, 2, 2, 2 * kTile, hs);
  block_dkv_kernel<<<row_grid(B, Tk, NKV), kRows * 32, dkv_shared, ctx.stream>>>(dk, dv, lddkv, dout, delta, lse, q,
                                                                                 ldq, k, v, ldkv, pos, S);
  check_launch("block_dkv_kernel");
}

}  // namespace pipetrain::cuda
