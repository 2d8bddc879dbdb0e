// Causal grouped-query attention with bf16 products: bf16 storage on a CPU that multiplies
// bf16 natively (oneDNN on AVX512_BF16 / AMX). The blocks of attention.cpp, with the
// operands a bf16 attention multiplies: Q, K, V, the probabilities P, dO and dS in bf16,
// every product summed in f32, the softmax and its backward in f32.
//
// oneDNN runs a product on its fast (brgemm, AMX) kernels only when its operands are dense,
// and attention's products are small (64 query rows against at most T keys, head size 64),
// so every operand is laid out densely first: Q, K, V (and dO) are cast to bf16 head-major,
// (head, token, channel) — qkv arrives in f32 holding bf16 values, or as a bf16 run stores
// it, and is then only reordered; P and dS are dense (rows x keys so far) blocks, P block by block as
// the stash keeps it (pipetrain/backend/attention.hpp), written in bf16 by the softmax
// itself; outputs gather head-major in f32 and are scattered into their rows once per
// sequence.
#include <cmath>

#include "attention_rows.hpp"
#include "cpu_kernels.hpp"

namespace pipetrain::cpu {
namespace {

// The softmax of a row of f32 scores, written as bf16 probabilities p[0..width).
PIPETRAIN_SIMD_CLONES
void causal_softmax_row_bf16(bf16* p, float* row, int first, int len, int width) {
  causal_softmax_row(row, first, len, len);
  for (int k = 0; k < len; ++k) p[k] = to_bf16(row[k]);
  for (int k = len; k < width; ++k) p[k] = bf16{};
}

// causal_softmax_backward_row with bf16 probabilities; dS written in bf16 (0 from len on).
PIPETRAIN_SIMD_CLONES
void causal_softmax_backward_row_bf16(bf16* ds, const float* dp, const bf16* p, int len, int width, float scale) {
  float acc[kLanes] = {};
  int c = 0;
  for (; c + kLanes <= len; c += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] += to_float(p[c + j]) * dp[c + j];
  }
  float dot = 0.0f;
  for (; c < len; ++c) dot += to_float(p[c]) * dp[c];
  for (int j = 0; j < kLanes; ++j) dot += acc[j];
  for (int k = 0; k < len; ++k) ds[k] = to_bf16(scale * to_float(p[k]) * (dp[k] - dot));
  for (int k = len; k < width; ++k) ds[k] = bf16{};
}

// C = alpha op(A) op(B) + beta C on bf16 operands with f32 sums (oneDNN; widened for sgemm
// where it has no kernel for the shape).
void product(bool ta, bool tb, int M, int N, int K, float alpha, const bf16* A, int lda, const bf16* B, int ldb,
             float beta, float* C, int ldc, std::vector<float>& widened) {
  gemm_bf16(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, Backend::Epilogue::kNone, nullptr, nullptr, widened,
            Bf16Products::kOnednn);
}

KOKKOS_INLINE_FUNCTION bf16 as_bf16(float x) { return to_bf16(x); }
KOKKOS_INLINE_FUNCTION bf16 as_bf16(bf16 x) { return x; }

// rows x (G hs) row-major (row stride ld) -> G x rows x hs, in bf16 (cast from f32, or
// copied from a stored bf16 tensor).
template <class S>
void to_heads(bf16* dst, const S* src, int rows, int G, int hs, int ld) {
  Kokkos::parallel_for("pipetrain::attention_to_heads", HostRange(0, rows), [=](const int64_t t) {
    for (int g = 0; g < G; ++g) {
      const S* in = src + t * ld + static_cast<int64_t>(g) * hs;
      bf16* o = dst + (static_cast<int64_t>(g) * rows + t) * hs;
      for (int e = 0; e < hs; ++e) o[e] = as_bf16(in[e]);
    }
  });
}

// G x rows x hs (f32) -> rows x (G hs), row stride ld.
void from_heads(float* dst, const float* src, int rows, int G, int hs, int ld) {
  Kokkos::parallel_for("pipetrain::attention_from_heads", HostRange(0, rows), [=](const int64_t t) {
    for (int g = 0; g < G; ++g) {
      const float* in = src + (static_cast<int64_t>(g) * rows + t) * hs;
      float* o = dst + t * ld + static_cast<int64_t>(g) * hs;
      for (int e = 0; e < hs; ++e) o[e] = in[e];
    }
  });
}

}  // namespace

template <class Q>
void attention_forward_bf16(float* out, bf16* att, const Q* qkv, bf16* heads, float* scores, float* out_heads, int B,
                            int T, int C, int NH, int NKV, std::vector<float>& widened, const int32_t* positions) {
  const int hs = C / NH, group = NH / NKV, G = NH + 2 * NKV, C3 = G * hs;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t kept = causal_block_elements(T), head = static_cast<int64_t>(T) * hs;
  for (int b = 0; b < B; ++b) {
    to_heads(heads, qkv + static_cast<int64_t>(b) * T * C3, T, G, hs, C3);
    for (int h = 0; h < NH; ++h) {
      const bf16* q = heads + h * head;
      const bf16* k = heads + (NH + h / group) * head;
      const bf16* v = heads + (NH + NKV + h / group) * head;
      bf16* a = att + (static_cast<int64_t>(b) * NH + h) * kept;
      float* o = out_heads + h * head;
      const int32_t* pos = positions ? positions + static_cast<int64_t>(b) * T : nullptr;
      for (int i0 = 0; i0 < T; i0 += kAttnBlock) {
        const int i1 = i0 + kAttnBlock < T ? i0 + kAttnBlock : T;
        const int nb = i1 - i0;
        bf16* ab = a + causal_block_offset(i0);  // nb x i1
        // S = scale * Q_blk K[0:i1]^T   (nb x i1, f32)
        product(false, true, nb, i1, hs, scale, q + static_cast<int64_t>(i0) * hs, hs, k, hs, 0.0f, scores, i1,
                widened);
        Kokkos::parallel_for("pipetrain::attention_softmax_bf16", HostRange(0, nb), [=](const int64_t r) {
          const int i = i0 + static_cast<int>(r);
          causal_softmax_row_bf16(ab + r * i1, scores + r * i1, first_visible_key(pos, i, i), i + 1, i1);
        });
        // O_blk = P_blk V[0:i1]   (nb x hs)
        product(false, false, nb, hs, i1, 1.0f, ab, i1, v, hs, 0.0f, o + static_cast<int64_t>(i0) * hs, hs, widened);
      }
    }
    from_heads(out + static_cast<int64_t>(b) * T * C, out_heads, T, NH, hs, C);
  }
}

template <class Q>
void attention_backward_bf16(float* dqkv, const float* dout, const Q* qkv, const bf16* att, bf16* heads,
                             bf16* dout_heads, float* grad_heads, float* dp, bf16* ds, int B, int T, int C, int NH,
                             int NKV, std::vector<float>& widened) {
  const int hs = C / NH, group = NH / NKV, G = NH + 2 * NKV, C3 = G * hs;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t kept = causal_block_elements(T), head = static_cast<int64_t>(T) * hs;
  const int nblocks = (T + kAttnBlock - 1) / kAttnBlock;
  for (int b = 0; b < B; ++b) {
    to_heads(heads, qkv + static_cast<int64_t>(b) * T * C3, T, G, hs, C3);
    to_heads(dout_heads, dout + static_cast<int64_t>(b) * T * C, T, NH, hs, C);
    for (int h = 0; h < NH; ++h) {
      const bf16* q = heads + h * head;
      const bf16* k = heads + (NH + h / group) * head;
      const bf16* v = heads + (NH + NKV + h / group) * head;
      const bf16* dO = dout_heads + h * head;
      float* dq = grad_heads + h * head;
      float* dk = grad_heads + (NH + h / group) * head;
      float* dv = grad_heads + (NH + NKV + h / group) * head;
      const bool first_of_group = h % group == 0;  // it overwrites the group's dK and dV
      const bf16* a = att + (static_cast<int64_t>(b) * NH + h) * kept;
      // Last block first, as attention_backward: it covers every key row, so the group's
      // first query head overwrites dK and dV there (beta = 0) and the rest accumulate.
      for (int blk = nblocks - 1; blk >= 0; --blk) {
        const int i0 = blk * kAttnBlock;
        const int i1 = i0 + kAttnBlock < T ? i0 + kAttnBlock : T;
        const int nb = i1 - i0;
        const float beta = blk == nblocks - 1 && first_of_group ? 0.0f : 1.0f;
        const bf16* ab = a + causal_block_offset(i0);  // nb x i1
        const bf16* dOb = dO + static_cast<int64_t>(i0) * hs;
        // dV[0:i1] (+)= P_blk^T dO_blk   (i1 x hs)
        product(true, false, i1, hs, nb, 1.0f, ab, i1, dOb, hs, beta, dv, hs, widened);
        // dP_blk = dO_blk V[0:i1]^T   (nb x i1, f32)
        product(false, true, nb, i1, hs, 1.0f, dOb, hs, v, hs, 0.0f, dp, i1, widened);
        // dS = scale * P (dP - rowsum(P dP)), in bf16
        Kokkos::parallel_for("pipetrain::attention_softmax_backward_bf16", HostRange(0, nb), [=](const int64_t r) {
          causal_softmax_backward_row_bf16(ds + r * i1, dp + r * i1, ab + r * i1, i0 + static_cast<int>(r) + 1, i1,
                                           scale);
        });
        // dQ_blk = dS_blk K[0:i1]   (nb x hs)
        product(false, false, nb, hs, i1, 1.0f, ds, i1, k, hs, 0.0f, dq + static_cast<int64_t>(i0) * hs, hs, widened);
        // dK[0:i1] (+)= dS_blk^T Q_blk   (i1 x hs)
        product(true, false, i1, hs, nb, 1.0f, ds, i1, q + static_cast<int64_t>(i0) * hs, hs, beta, dk, hs, widened);
      }
    }
    from_heads(dqkv + static_cast<int64_t>(b) * T * C3, grad_heads, T, G, hs, C3);
  }
}

#define PIPETRAIN_ATTENTION_BF16(Q)                                                                                \
  template void attention_forward_bf16(float*, bf16*, const Q*, bf16*, float*, float*, int, int, int, int, int,    \
                                       std::vector<float>&, const int32_t*);                                       \
  template void attention_backward_bf16(float*, const float*, const Q*, const bf16*, bf16*, bf16*, float*, float*, \
                                        bf16*, int, int, int, int, int, std::vector<float>&);
PIPETRAIN_ATTENTION_BF16(float)
PIPETRAIN_ATTENTION_BF16(bf16)
#undef PIPETRAIN_ATTENTION_BF16

}  // namespace pipetrain::cpu
