// Causal grouped-query self-attention on a fused (B, T, C + 2 NKV hs) QKV tensor (NKV =
// NH: GPT-2's multi-head attention on (B, T, 3C)).
//
// Every matrix product is a BLAS sgemm whose leading dimensions index straight
// into qkv (R = C + 2 NKV hs), out/dout (C) and the (T, T) score slice of each (b, h): no
// copies. Query head h reads key/value head h / (NH / NKV); in backward the query heads
// of a group add into their key/value head's gradient. Queries are processed in blocks of
// kAttnBlock rows; block [i0, i1) only multiplies against keys 0 .. i1-1 and keeps its
// probabilities as a dense (i1 - i0) x i1 array (pipetrain/backend/attention.hpp), so the
// causal upper triangle beyond the block is neither computed nor stored. The row-wise
// softmax (and its backward) runs as a Kokkos kernel over the rows of a block. Packed
// documents (core/documents.hpp): a query's softmax starts at its document's first key, so
// the probabilities of other documents' keys are kept as 0, and the backward, reading
// them, gives those keys no gradient.
#include <cmath>
#include <vector>

#include "attention_rows.hpp"
#include "cpu_kernels.hpp"

namespace pipetrain::cpu {

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH, int NKV,
                       const int32_t* positions) {
  const int hs = C / NH, group = NH / NKV, Ckv = NKV * hs;
  const int C3 = C + 2 * Ckv;  // the row stride of qkv
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t kept = causal_block_elements(T);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const float* row = qkv + static_cast<int64_t>(b) * T * C3;
      const float* q = row + h * hs;
      const float* k = row + C + (h / group) * hs;
      const float* v = k + Ckv;
      float* a = att + (static_cast<int64_t>(b) * NH + h) * kept;
      float* o = out + static_cast<int64_t>(b) * T * C + h * hs;
      const int32_t* pos = positions ? positions + static_cast<int64_t>(b) * T : nullptr;
      for (int i0 = 0; i0 < T; i0 += kAttnBlock) {
        const int i1 = i0 + kAttnBlock < T ? i0 + kAttnBlock : T;
        const int nb = i1 - i0;
        float* ab = a + causal_block_offset(i0);  // nb x i1
        // S = scale * Q_blk K[0:i1]^T   (nb x i1)
        gemm(false, true, nb, i1, hs, scale, q + static_cast<int64_t>(i0) * C3, C3, k, C3, 0.0f, ab, i1);
        Kokkos::parallel_for("pipetrain::attention_softmax", HostRange(0, nb), [=](const int64_t r) {
          const int i = i0 + static_cast<int>(r);
          causal_softmax_row(ab + r * i1, first_visible_key(pos, i, i), i + 1, i1);
        });
        // out_blk = P_blk V[0:i1]   (nb x hs)
        gemm(false, false, nb, hs, i1, 1.0f, ab, i1, v, C3, 0.0f, o + static_cast<int64_t>(i0) * C, C);
      }
    }
  }
}

// The same products and softmax for n new queries against a cache of pos + n keys.
void attention_decode(float* out, const float* q, int ldq, const float* k, const float* v, int ldkv, int n, int pos,
                      int NH, int NKV, int hs) {
  const int group = NH / NKV, L = pos + n, C = NH * hs;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  std::vector<float> scores(static_cast<size_t>(n) * L);
  float* s = scores.data();
  for (int h = 0; h < NH; ++h) {
    const float* kh = k + (h / group) * hs;
    const float* vh = v + (h / group) * hs;
    gemm(false, true, n, L, hs, scale, q + h * hs, ldq, kh, ldkv, 0.0f, s, L);  // S = scale Q K^T  (n x L)
    Kokkos::parallel_for("pipetrain::attention_decode_softmax", HostRange(0, n),
                         [=](const int64_t i) { causal_softmax_row(s + i * L, 0, pos + static_cast<int>(i) + 1, L); });
    gemm(false, false, n, hs, L, 1.0f, s, L, vh, ldkv, 0.0f, out + h * hs, C);  // out = P V  (n x hs)
  }
}

void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int B, int T, int C, int NH, int NKV) {
  const int hs = C / NH, group = NH / NKV, Ckv = NKV * hs;
  const int C3 = C + 2 * Ckv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int nblocks = (T + kAttnBlock - 1) / kAttnBlock;
  const int64_t kept = causal_block_elements(T);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const int64_t row = static_cast<int64_t>(b) * T * C3, qo = h * hs, ko = C + (h / group) * hs;
      const float* q = qkv + row + qo;
      const float* k = qkv + row + ko;
      const float* v = k + Ckv;
      float* dq = dqkv + row + qo;
      float* dk = dqkv + row + ko;
      float* dv = dk + Ckv;
      const bool first_of_group = h % group == 0;  // it overwrites the group's dK and dV
      const float* a = att + (static_cast<int64_t>(b) * NH + h) * kept;
      float* s = scratch + (static_cast<int64_t>(b) * NH + h) * kept;
      const float* dO = dout + static_cast<int64_t>(b) * T * C + h * hs;
      // Last block first: it touches every key row, so for the group's first query head
      // it overwrites dK and dV (beta = 0); earlier blocks and the group's other heads
      // accumulate into them.
      for (int blk = nblocks - 1; blk >= 0; --blk) {
        const int i0 = blk * kAttnBlock;
        const int i1 = i0 + kAttnBlock < T ? i0 + kAttnBlock : T;
        const int nb = i1 - i0;
        const float beta = blk == nblocks - 1 && first_of_group ? 0.0f : 1.0f;
        const float* ab = a + causal_block_offset(i0);  // nb x i1, as forward kept it
        float* sb = s + causal_block_offset(i0);
        const float* dOb = dO + static_cast<int64_t>(i0) * C;
        // dV[0:i1] (+)= P_blk^T dO_blk   (i1 x hs)
        gemm(true, false, i1, hs, nb, 1.0f, ab, i1, dOb, C, beta, dv, C3);
        // dP_blk = dO_blk V[0:i1]^T   (nb x i1)
        gemm(false, true, nb, i1, hs, 1.0f, dOb, C, v, C3, 0.0f, sb, i1);
        // dS = scale * P (dP - rowsum(P dP)), in place over dP
        Kokkos::parallel_for("pipetrain::attention_softmax_backward", HostRange(0, nb), [=](const int64_t r) {
          causal_softmax_backward_row(sb + r * i1, ab + r * i1, i0 + static_cast<int>(r) + 1, i1, scale);
        });
        // dQ_blk = dS_blk K[0:i1]   (nb x hs)
        gemm(false, false, nb, hs, i1, 1.0f, sb, i1, k, C3, 0.0f, dq + static_cast<int64_t>(i0) * C3, C3);
        // dK[0:i1] (+)= dS_blk^T Q_blk   (i1 x hs)
        gemm(true, false, i1, hs, nb, 1.0f, sb, i1, q + static_cast<int64_t>(i0) * C3, C3, beta, dk, C3);
      }
    }
  }
}

}  // namespace pipetrain::cpu
