// Causal multi-head self-attention on a fused (B, T, 3C) QKV tensor, with the
// blocked-causal structure of src/backend/cpu/attention.cpp: queries in blocks of
// `block` rows, and block [i0, i1) multiplies only against keys 0 .. i1-1, so the
// upper triangle beyond each block is never computed. Every matrix product is a
// cuBLAS strided-batched sgemm whose leading dimensions index straight into qkv
// (3C), out/dout (C) and the (T, T) slices of att/scratch: no copies. One call
// covers a query block for all heads of one sequence (or all sequences of one
// head, whichever batch is larger). The row softmax (and its backward) is a single
// kernel launch over all B * NH * T rows, one warp per row, between the products.
// Packed documents (core/documents.hpp): a row's softmax starts at its query's first key
// and the probabilities before it are kept as 0, so the backward, reading them, gives
// those keys no gradient and needs no positions.
#include <cmath>

#include "cuda_device.cuh"
#include "cuda_kernels.hpp"

namespace pipetrain::cuda {
namespace {

constexpr unsigned kWarpsPerBlock = 8;

// Query block: 64 rows as on the CPU for short sequences, growing so that there
// are at most 8 blocks (fewer, larger products for long sequences).
int query_block(int T) {
  const int per8 = (T + 7) / 8;
  const int b = (per8 + 63) / 64 * 64;
  return b < 64 ? 64 : b;
}

// How the (b, h) pairs are cut into cuBLAS batches: `outer` calls, each over
// `inner` matrices; strides (in floats) for qkv (and dqkv), out (and dout), att.
struct Batching {
  int outer, inner;
  long outer_qkv, outer_out, outer_att;
  long inner_qkv, inner_out, inner_att;
};

Batching batching(int B, int T, int C, int NH) {
  const int hs = C / NH;
  const long qkv_seq = 3L * C * T, out_seq = static_cast<long>(C) * T, att_head = long(T) * T;
  if (NH >= B) {  // batch over the heads of one sequence
    return {B, NH, qkv_seq, out_seq, NH * att_head, hs, hs, att_head};
  }
  return {NH, B, hs, hs, att_head, qkv_seq, out_seq, NH * att_head};  // over sequences
}

// Row r of the (B*NH*T, T) probability matrix: softmax over entries first..i
// (i = r % T, first its first visible key, scores already scaled) in place; the
// entries before first and i+1 .. T-1 set to 0.
__global__ void causal_softmax_kernel(float* att, int T, int NH, const int32_t* positions, int64_t rows) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int lane = threadIdx.x & 31;
  const int i = static_cast<int>(r % T), len = i + 1;
  const int64_t b = r / (static_cast<int64_t>(NH) * T);
  // Clamped: malformed positions still write inside the row only.
  const int first = min(max(first_key(positions ? positions + b * T : nullptr, i), 0), i);
  float* row = att + r * T;
  float m = -INFINITY;
  for (int k = first + lane; k < len; k += 32) m = fmaxf(m, row[k]);
  m = warp_reduce(m, MaxOp{});
  float s = 0.0f;
  for (int k = first + lane; k < len; k += 32) {
    const float e = expf(row[k] - m);
    row[k] = e;
    s += e;
  }
  const float inv = 1.0f / warp_sum(s);
  for (int k = first + lane; k < len; k += 32) row[k] *= inv;
  for (int k = lane; k < first; k += 32) row[k] = 0.0f;
  for (int k = len + lane; k < T; k += 32) row[k] = 0.0f;
}

// Softmax backward, row r (i = r % T, its query block ends at i1): over dp in
// place, ds[k] = scale * p[k] * (dp[k] - sum_j p[j] dp[j]) for k <= i, 0 for
// i < k < i1 (the products that follow read columns 0 .. i1-1). Keys before a packed
// document's first have p[k] = 0, hence ds[k] = 0.
__global__ void causal_softmax_backward_kernel(float* dp, const float* __restrict__ att, int T,
                                               int block, float scale, int64_t rows) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int lane = threadIdx.x & 31;
  const int i = static_cast<int>(r % T);
  const int len = i + 1;
  const int i1 = (i / block + 1) * block < T ? (i / block + 1) * block : T;
  float* d = dp + r * T;
  const float* p = att + r * T;
  float dot = 0.0f;
  for (int k = lane; k < len; k += 32) dot += p[k] * d[k];
  dot = warp_sum(dot);
  for (int k = lane; k < len; k += 32) d[k] = scale * p[k] * (d[k] - dot);
  for (int k = len + lane; k < i1; k += 32) d[k] = 0.0f;
}

unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

}  // namespace

void attention_forward(const Ctx& ctx, float* out, float* att, const float* qkv, int B, int T, int C, int NH,
                       const int32_t* positions) {
  if (B <= 0 || T <= 0 || C <= 0 || NH <= 0) return;
  const int hs = C / NH, C3 = 3 * C, block = query_block(T);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const Batching g = batching(B, T, C, NH);
  for (int o = 0; o < g.outer; ++o) {
    const float* q = qkv + o * g.outer_qkv;
    const float* k = q + C;
    float* a = att + o * g.outer_att;
    for (int i0 = 0; i0 < T; i0 += block) {
      const int i1 = i0 + block < T ? i0 + block : T;
      // S = scale * Q_blk K[0:i1]^T   (nb x i1)
      gemm_strided_batched(ctx, false, true, i1 - i0, i1, hs, scale, q + long(i0) * C3, C3,
                           g.inner_qkv, k, C3, g.inner_qkv, 0.0f, a + long(i0) * T, T,
                           g.inner_att, g.inner);
    }
  }
  const int64_t rows = static_cast<int64_t>(B) * NH * T;
  causal_softmax_kernel<<<row_blocks(rows), 32 * kWarpsPerBlock, 0, ctx.stream>>>(att, T, NH, positions, rows);
  check_launch("attention softmax");
  for (int o = 0; o < g.outer; ++o) {
    const float* v = qkv + o * g.outer_qkv + 2 * C;
    const float* a = att + o * g.outer_att;
    float* y = out + o * g.outer_out;
    for (int i0 = 0; i0 < T; i0 += block) {
      const int i1 = i0 + block < T ? i0 + block : T;
      // out_blk = P_blk V[0:i1]   (nb x hs)
      gemm_strided_batched(ctx, false, false, i1 - i0, hs, i1, 1.0f, a + long(i0) * T, T,
                           g.inner_att, v, C3, g.inner_qkv, 0.0f, y + long(i0) * C, C,
                           g.inner_out, g.inner);
    }
  }
}

namespace {
// One block per (new query i, head h): scores over the L = pos + i + 1 keys it sees in
// shared memory, the block's max and sum, then each thread one or more output channels.
__global__ void attention_decode_kernel(float* out, const float* q, int ldq, const float* k, const float* v,
                                        int ldkv, int pos, int NH, int NKV, int hs, float scale) {
  extern __shared__ float p[];
  const int i = blockIdx.x, h = blockIdx.y, g = h / (NH / NKV), L = pos + i + 1;
  const float* qi = q + static_cast<long>(i) * ldq + h * hs;
  float m = -INFINITY;
  for (int j = threadIdx.x; j < L; j += blockDim.x) {
    const float* kj = k + static_cast<long>(j) * ldkv + g * hs;
    float s = 0.0f;
    for (int d = 0; d < hs; ++d) s += qi[d] * kj[d];
    p[j] = s * scale;
    m = fmaxf(m, p[j]);
  }
  m = block_max(m);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < L; j += blockDim.x) {
    p[j] = expf(p[j] - m);
    sum += p[j];
  }
  sum = block_sum(sum);
  __syncthreads();
  const float inv = 1.0f / sum;
  for (int d = threadIdx.x; d < hs; d += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < L; ++j) acc += p[j] * v[static_cast<long>(j) * ldkv + g * hs + d];
    out[static_cast<long>(i) * NH * hs + h * hs + d] = acc * inv;
  }
}
}  // namespace

int attention_decode_max_keys() {
  int device = 0, optin = 0;
  PIPETRAIN_CUDA_CHECK(cudaGetDevice(&device));
  PIPETRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  cudaFuncAttributes attr{};
  PIPETRAIN_CUDA_CHECK(cudaFuncGetAttributes(&attr, attention_decode_kernel));
  return (optin - static_cast<int>(attr.sharedSizeBytes)) / static_cast<int>(sizeof(float));
}

void attention_decode(const Ctx& ctx, float* out, const float* q, int ldq, const float* k, const float* v, int ldkv,
                      int n, int pos, int NH, int NKV, int hs) {
  if (n <= 0) return;
  const size_t shared = static_cast<size_t>(pos + n) * sizeof(float);  // the caller checks attention_decode_max_keys
  if (shared > 48 * 1024)  // beyond the default dynamic limit: opt in (per kernel, not per launch)
    PIPETRAIN_CUDA_CHECK(cudaFuncSetAttribute(attention_decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(shared)));
  attention_decode_kernel<<<dim3(static_cast<unsigned>(n), static_cast<unsigned>(NH)), 128, shared, ctx.stream>>>(
      out, q, ldq, k, v, ldkv, pos, NH, NKV, hs, 1.0f / sqrtf(static_cast<float>(hs)));
  check_launch("attention_decode");
}

void attention_backward(const Ctx& ctx, float* dqkv, float* scratch, const float* dout,
                        const float* qkv, const float* att, int B, int T, int C, int NH) {
  if (B <= 0 || T <= 0 || C <= 0 || NH <= 0) return;
  const int hs = C / NH, C3 = 3 * C, block = query_block(T);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int nblocks = (T + block - 1) / block;
  const Batching g = batching(B, T, C, NH);
  // dP_blk = dO_blk V[0:i1]^T   (nb x i1), into scratch
  for (int o = 0; o < g.outer; ++o) {
    const float* v = qkv + o * g.outer_qkv + 2 * C;
    const float* dO = dout + o * g.outer_out;
    float* s = scratch + o * g.outer_att;
    for (int i0 = 0; i0 < T; i0 += block) {
      const int i1 = i0 + block < T ? i0 + block : T;
      gemm_strided_batched(ctx, false, true, i1 - i0, i1, hs, 1.0f, dO + long(i0) * C, C,
                           g.inner_out, v, C3, g.inner_qkv, 0.0f, s + long(i0) * T, T,
                           g.inner_att, g.inner);
    }
  }
  // dS = scale * P (dP - rowsum(P dP)), in place
  const int64_t rows = static_cast<int64_t>(B) * NH * T;
  causal_softmax_backward_kernel<<<row_blocks(rows), 32 * kWarpsPerBlock, 0, ctx.stream>>>(
      scratch, att, T, block, scale, rows);
  check_launch("attention softmax backward");
  for (int o = 0; o < g.outer; ++o) {
    const long off = o * g.outer_qkv;
    const float* q = qkv + off;
    const float* k = q + C;
    float* dq = dqkv + off;
    float* dk = dq + C;
    float* dv = dq + 2 * C;
    const float* a = att + o * g.outer_att;
    const float* s = scratch + o * g.outer_att;
    const float* dO = dout + o * g.outer_out;
    // Last block first: it touches every key row, so it overwrites dK and dV
    // (beta = 0) and the earlier blocks accumulate into them.
    for (int blk = nblocks - 1; blk >= 0; --blk) {
      const int i0 = blk * block;
      const int i1 = i0 + block < T ? i0 + block : T;
      const int nb = i1 - i0;
      const float beta = blk == nblocks - 1 ? 0.0f : 1.0f;
      const float* ab = a + long(i0) * T;
      const float* sb = s + long(i0) * T;
      const float* dOb = dO + long(i0) * C;
      // dQ_blk = dS_blk K[0:i1]   (nb x hs)
      gemm_strided_batched(ctx, false, false, nb, hs, i1, 1.0f, sb, T, g.inner_att, k, C3,
                           g.inner_qkv, 0.0f, dq + long(i0) * C3, C3, g.inner_qkv, g.inner);
      // dV[0:i1] (+)= P_blk^T dO_blk   (i1 x hs)
      gemm_strided_batched(ctx, true, false, i1, hs, nb, 1.0f, ab, T, g.inner_att, dOb, C,
                           g.inner_out, beta, dv, C3, g.inner_qkv, g.inner);
      // dK[0:i1] (+)= dS_blk^T Q_blk   (i1 x hs)
      gemm_strided_batched(ctx, true, false, i1, hs, nb, 1.0f, sb, T, g.inner_att,
                           q + long(i0) * C3, C3, g.inner_qkv, beta, dk, C3, g.inner_qkv,
                           g.inner);
    }
  }
}

}  // namespace pipetrain::cuda
