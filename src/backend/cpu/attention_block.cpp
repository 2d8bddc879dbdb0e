// Attention of queries against one block of keys and values with global positions, flash
// style (context parallelism's ring, model/ring_attention.hpp): the forward gives the
// block's output normalized within the block and the log-sum-exp of its visible scores,
// which the ring merges block by block; the backward recomputes each block's probabilities
// from the merged log-sum-exp (exp(S - lse): nothing of T x T is kept between the passes)
// and accumulates dQ and the block's dK and dV. Per (sequence, head) three sgemms each way,
// with a row kernel between them; exp in double-free f32 as the causal kernel's softmax.
#include <cmath>
#include <limits>
#include <vector>

#include "cpu_kernels.hpp"

namespace pipetrain::cpu {
namespace {

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

// Masks row i's scores to the visible keys (kpos[j] <= qpos), exponentiates them against
// the row's own max and normalizes; returns the log-sum-exp (-inf with no visible key:
// the row is all 0).
float block_softmax_row(float* s, const int32_t* kpos, int32_t qpos, int Tk) {
  float m = kMinusInf;
  for (int j = 0; j < Tk; ++j) {
    if (kpos[j] > qpos) s[j] = kMinusInf;
    m = s[j] > m ? s[j] : m;
  }
  if (m == kMinusInf) {
    for (int j = 0; j < Tk; ++j) s[j] = 0.0f;
    return kMinusInf;
  }
  double sum = 0.0;
  for (int j = 0; j < Tk; ++j) {
    s[j] = s[j] == kMinusInf ? 0.0f : std::exp(s[j] - m);
    sum += s[j];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int j = 0; j < Tk; ++j) s[j] *= inv;
  return m + static_cast<float>(std::log(sum));
}

}  // namespace

void attention_block_forward(float* out, float* lse, const float* q, int ldq, const float* k, const float* v, int ldkv,
                             const int32_t* qpos, const int32_t* kpos, int B, int Tq, int Tk, int NH, int NKV, int hs,
                             float* scores) {
  const int group = NH / NKV, ldo = NH * hs;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      const float* qb = q + static_cast<int64_t>(b) * Tq * ldq + h * hs;
      const float* kb = k + static_cast<int64_t>(b) * Tk * ldkv + (h / group) * hs;
      const float* vb = v + static_cast<int64_t>(b) * Tk * ldkv + (h / group) * hs;
      const int32_t *qp = qpos + static_cast<int64_t>(b) * Tq, *kp = kpos + static_cast<int64_t>(b) * Tk;
      float* l = lse + (static_cast<int64_t>(b) * NH + h) * Tq;
      gemm(false, true, Tq, Tk, hs, scale, qb, ldq, kb, ldkv, 0.0f, scores, Tk);  // S = scale Q K^T
      Kokkos::parallel_for("pipetrain::attention_block_softmax", HostRange(0, Tq),
                           [=](const int64_t i) { l[i] = block_softmax_row(scores + i * Tk, kp, qp[i], Tk); });
      gemm(false, false, Tq, hs, Tk, 1.0f, scores, Tk, vb, ldkv, 0.0f,
           out + static_cast<int64_t>(b) * Tq * ldo + h * hs, ldo);  // O = P V
    }
}

void attention_block_backward(float* dq, int lddq, float* dk, float* dv, int lddkv, const float* dout,
                              const float* delta, const float* lse, const float* q, int ldq, const float* k,
                              const float* v, int ldkv, const int32_t* qpos, const int32_t* kpos, int B, int Tq, int Tk,
                              int NH, int NKV, int hs, float* p, float* ds) {
  const int group = NH / NKV, ldo = NH * hs;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      const int64_t qrow = static_cast<int64_t>(b) * Tq, krow = static_cast<int64_t>(b) * Tk, kv = (h / group) * hs;
      const float* qb = q + qrow * ldq + h * hs;
      const float* kb = k + krow * ldkv + kv;
      const float* vb = v + krow * ldkv + kv;
      const float* dO = dout + qrow * ldo + h * hs;
      const int32_t *qp = qpos + qrow, *kp = kpos + krow;
      const float* l = lse + (static_cast<int64_t>(b) * NH + h) * Tq;
      const float* D = delta + (static_cast<int64_t>(b) * NH + h) * Tq;
      gemm(false, true, Tq, Tk, hs, scale, qb, ldq, kb, ldkv, 0.0f, p, Tk);  // S
      gemm(false, true, Tq, Tk, hs, 1.0f, dO, ldo, vb, ldkv, 0.0f, ds, Tk);  // dP = dO V^T
      Kokkos::parallel_for("pipetrain::attention_block_backward_row", HostRange(0, Tq), [=](const int64_t i) {
        float* pr = p + i * Tk;
        float* dr = ds + i * Tk;
        for (int j = 0; j < Tk; ++j) {
          const bool seen = kp[j] <= qp[i] && l[i] != kMinusInf;
          pr[j] = seen ? std::exp(pr[j] - l[i]) : 0.0f;  // the merged softmax's probability
          dr[j] = pr[j] * (dr[j] - D[i]);                // dS (the scale goes into the products)
        }
      });
      gemm(true, false, Tk, hs, Tq, 1.0f, p, Tk, dO, ldo, 1.0f, dv + krow * lddkv + kv, lddkv);        // dV += P^T dO
      gemm(false, false, Tq, hs, Tk, scale, ds, Tk, kb, ldkv, 1.0f, dq + qrow * lddq + h * hs, lddq);  // dQ += s dS K
      gemm(true, false, Tk, hs, Tq, scale, ds, Tk, qb, ldq, 1.0f, dk + krow * lddkv + kv, lddkv);      // dK += s dS^T Q
    }
}

void attention_merge(float* out, float* lse, const float* block_out, const float* block_lse, int B, int T, int NH,
                     int hs) {
  const int64_t rows = static_cast<int64_t>(B) * T;
  Kokkos::parallel_for("pipetrain::attention_merge", HostRange(0, rows), [=](const int64_t r) {
    const int64_t b = r / T, t = r % T;
    for (int h = 0; h < NH; ++h) {
      const int64_t at = (b * NH + h) * T + t;
      const float a = lse[at], c = block_lse[at];
      if (c == kMinusInf) continue;  // the block has nothing this row may see
      const float m = a > c ? a : c, wa = a == kMinusInf ? 0.0f : std::exp(a - m), wc = std::exp(c - m);
      const float sum = wa + wc;
      float* o = out + r * NH * hs + h * hs;
      const float* bo = block_out + r * NH * hs + h * hs;
      for (int d = 0; d < hs; ++d) o[d] = (wa * o[d] + wc * bo[d]) / sum;
      lse[at] = m + std::log(sum);
    }
  });
}

void attention_delta(float* delta, const float* dout, const float* out, int B, int T, int NH, int hs) {
  Kokkos::parallel_for("pipetrain::attention_delta", HostRange(0, static_cast<int64_t>(B) * T), [=](const int64_t r) {
    const int64_t b = r / T, t = r % T;
    for (int h = 0; h < NH; ++h) {
      const float* d = dout + r * NH * hs + h * hs;
      const float* o = out + r * NH * hs + h * hs;
      float s = 0.0f;
      for (int c = 0; c < hs; ++c) s += d[c] * o[c];
      delta[(b * NH + h) * T + t] = s;
    }
  });
}

}  // namespace pipetrain::cpu
