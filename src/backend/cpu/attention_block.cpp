// Attention of queries against one block of keys and values with global positions, flash
// style (context parallelism's ring, model/ring_attention.hpp): the forward gives the
// block's output normalized within the block and the log-sum-exp of its visible scores,
// which the ring merges block by block; the backward recomputes each block's probabilities
// from the merged log-sum-exp (exp(S - lse): nothing of T x T is kept between the passes)
// and accumulates dQ and the block's dK and dV. Per (sequence, head) three sgemms each way,
// with a row kernel between them; query and key runs of consecutive positions (a context-
// parallel rank's chunks) multiply only where some key of the pair is visible.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu_kernels.hpp"

namespace pipetrain::cpu {
namespace {

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

// Masks row i's scores to the visible keys (qstart <= kpos[j] <= qpos), exponentiates them against
// the row's own max and normalizes (fast_expf and kLanes partial sums, as the causal
// kernel's softmax); returns the log-sum-exp (-inf with no visible key: the row is all 0).
// What no pair computed (an invisible key) is only ever selected away.
PIPETRAIN_SIMD_CLONES
float block_softmax_row(float* s, const int32_t* kpos, int32_t qpos, int32_t qstart, int Tk) {
  const auto seen = [=](int j) { return kpos[j] <= qpos && kpos[j] >= qstart; };
  float m = kMinusInf;
  for (int j = 0; j < Tk; ++j) {
    const float x = seen(j) ? s[j] : kMinusInf;
    s[j] = x;
    m = x > m ? x : m;
  }
  if (m == kMinusInf) {
    for (int j = 0; j < Tk; ++j) s[j] = 0.0f;
    return kMinusInf;
  }
  float sums[kLanes] = {};
  int c = 0;
  for (; c + kLanes <= Tk; c += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      const float e = seen(c + j) ? fast_expf(s[c + j] - m) : 0.0f;
      s[c + j] = e;
      sums[j] += e;
    }
  float sum = 0.0f;
  for (; c < Tk; ++c) {
    const float e = seen(c) ? fast_expf(s[c] - m) : 0.0f;
    s[c] = e;
    sum += e;
  }
  for (int j = 0; j < kLanes; ++j) sum += sums[j];
  const float inv = 1.0f / sum;
  for (int j = 0; j < Tk; ++j) s[j] *= inv;
  return m + std::log(sum);
}

// A row of the backward: p = exp(S - lse) (the merged softmax's probability) over the
// visible keys, dS = p (dP - delta) (the scale goes into the products), 0 elsewhere.
PIPETRAIN_SIMD_CLONES
void block_backward_row(float* p, float* ds, const int32_t* kpos, int32_t qpos, int32_t qstart, float lse, float delta,
                        int Tk) {
  if (lse == kMinusInf) {
    for (int j = 0; j < Tk; ++j) p[j] = ds[j] = 0.0f;
    return;
  }
  for (int j = 0; j < Tk; ++j) {
    const bool seen = kpos[j] <= qpos && kpos[j] >= qstart;
    const float pj = seen ? fast_expf(p[j] - lse) : 0.0f;
    p[j] = pj;
    ds[j] = seen ? pj * (ds[j] - delta) : 0.0f;
  }
}

// Rows [first, first + n) whose positions run lo, lo + 1, ..., hi: a context-parallel rank's
// chunks. In the ring half the pairs of a query run and a key run of a block see nothing.
struct Run {
  int first, n;
  int32_t lo, hi;
};

std::vector<Run> runs_of(const int32_t* pos, int n) {
  std::vector<Run> runs;
  for (int i = 0; i < n; ++i) {
    if (runs.empty() || pos[i] != runs.back().hi + 1)
      runs.push_back({i, 1, pos[i], pos[i]});
    else
      ++runs.back().n, runs.back().hi = pos[i];
  }
  return runs;
}

// The products' tiles: every key of a run visible to every query of a run (a whole pair), or
// where the runs overlap (the causal diagonal), blocks of kAttnBlock queries with the keys
// up to their last one, as the causal kernel; nothing where no key is visible.
struct Tile {
  int q0, qn, k0, kn;
};

std::vector<Tile> tiles_of(const std::vector<Run>& queries, const std::vector<Run>& keys) {
  std::vector<Tile> tiles;
  for (const Run& r : queries)
    for (const Run& c : keys) {
      if (c.lo > r.hi) continue;
      if (c.hi <= r.lo) {
        tiles.push_back({r.first, r.n, c.first, c.n});
        continue;
      }
      for (int q0 = r.first; q0 < r.first + r.n; q0 += kAttnBlock) {
        const int qn = std::min(kAttnBlock, r.first + r.n - q0);
        const int64_t last = int64_t{r.lo} + (q0 - r.first) + qn - 1;  // the block's last query position
        const int kn = static_cast<int>(std::min<int64_t>(c.n, last - c.lo + 1));
        if (kn > 0) tiles.push_back({q0, qn, c.first, kn});
      }
    }
  return tiles;
}

}  // namespace

void attention_block_forward(float* out, float* lse, const float* q, int ldq, const float* k, const float* v, int ldkv,
                             const int32_t* qpos, const int32_t* qstart, const int32_t* kpos, int B, int Tq, int Tk,
                             int NH, int NKV, int hs, float* scores) {
  const int group = NH / NKV, ldo = NH * hs;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int b = 0; b < B; ++b) {
    const int32_t *qp = qpos + static_cast<int64_t>(b) * Tq, *kp = kpos + static_cast<int64_t>(b) * Tk;
    const int32_t* qs = qstart ? qstart + static_cast<int64_t>(b) * Tq : nullptr;
    const std::vector<Tile> tiles = tiles_of(runs_of(qp, Tq), runs_of(kp, Tk));
    for (int h = 0; h < NH; ++h) {
      const float* qb = q + static_cast<int64_t>(b) * Tq * ldq + h * hs;
      const float* kb = k + static_cast<int64_t>(b) * Tk * ldkv + (h / group) * hs;
      const float* vb = v + static_cast<int64_t>(b) * Tk * ldkv + (h / group) * hs;
      float* ob = out + static_cast<int64_t>(b) * Tq * ldo + h * hs;
      float* l = lse + (static_cast<int64_t>(b) * NH + h) * Tq;
      for (const Tile& t : tiles)  // S = scale Q K^T
        gemm(false, true, t.qn, t.kn, hs, scale, qb + int64_t{t.q0} * ldq, ldq, kb + int64_t{t.k0} * ldkv, ldkv, 0.0f,
             scores + int64_t{t.q0} * Tk + t.k0, Tk);
      Kokkos::parallel_for("pipetrain::attention_block_softmax", HostRange(0, Tq), [=](const int64_t i) {
        l[i] = block_softmax_row(scores + i * Tk, kp, qp[i], qs ? qs[i] : 0, Tk);
      });
      for (int i = 0; i < Tq; ++i)
        for (int d = 0; d < hs; ++d) ob[int64_t{i} * ldo + d] = 0.0f;
      for (const Tile& t : tiles)  // O = P V
        gemm(false, false, t.qn, hs, t.kn, 1.0f, scores + int64_t{t.q0} * Tk + t.k0, Tk, vb + int64_t{t.k0} * ldkv,
             ldkv, 1.0f, ob + int64_t{t.q0} * ldo, ldo);
    }
  }
}

void attention_block_backward(float* dq, int lddq, float* dk, float* dv, int lddkv, const float* dout,
                              const float* delta, const float* lse, const float* q, int ldq, const float* k,
                              const float* v, int ldkv, const int32_t* qpos, const int32_t* qstart, const int32_t* kpos,
                              int B, int Tq, int Tk, int NH, int NKV, int hs, float* p, float* ds) {
  const int group = NH / NKV, ldo = NH * hs;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int b = 0; b < B; ++b) {
    const int64_t qrow = static_cast<int64_t>(b) * Tq, krow = static_cast<int64_t>(b) * Tk;
    const int32_t *qp = qpos + qrow, *kp = kpos + krow, *qs = qstart ? qstart + qrow : nullptr;
    const std::vector<Tile> tiles = tiles_of(runs_of(qp, Tq), runs_of(kp, Tk));
    for (int h = 0; h < NH; ++h) {
      const int64_t kv = (h / group) * hs;
      const float* qb = q + qrow * ldq + h * hs;
      const float* kb = k + krow * ldkv + kv;
      const float* vb = v + krow * ldkv + kv;
      const float* dO = dout + qrow * ldo + h * hs;
      float* dqb = dq + qrow * lddq + h * hs;
      float* dkb = dk + krow * lddkv + kv;
      float* dvb = dv + krow * lddkv + kv;
      const float* l = lse + (static_cast<int64_t>(b) * NH + h) * Tq;
      const float* D = delta + (static_cast<int64_t>(b) * NH + h) * Tq;
      for (const Tile& t : tiles) {
        const int64_t at = int64_t{t.q0} * Tk + t.k0;
        gemm(false, true, t.qn, t.kn, hs, scale, qb + int64_t{t.q0} * ldq, ldq, kb + int64_t{t.k0} * ldkv, ldkv, 0.0f,
             p + at, Tk);  // S
        gemm(false, true, t.qn, t.kn, hs, 1.0f, dO + int64_t{t.q0} * ldo, ldo, vb + int64_t{t.k0} * ldkv, ldkv, 0.0f,
             ds + at, Tk);  // dP = dO V^T
      }
      Kokkos::parallel_for("pipetrain::attention_block_backward_row", HostRange(0, Tq), [=](const int64_t i) {
        block_backward_row(p + i * Tk, ds + i * Tk, kp, qp[i], qs ? qs[i] : 0, l[i], D[i], Tk);
      });
      for (const Tile& t : tiles) {
        const int64_t at = int64_t{t.q0} * Tk + t.k0, qi = t.q0, ki = t.k0;
        gemm(true, false, t.kn, hs, t.qn, 1.0f, p + at, Tk, dO + qi * ldo, ldo, 1.0f, dvb + ki * lddkv, lddkv);  // dV
        gemm(false, false, t.qn, hs, t.kn, scale, ds + at, Tk, kb + ki * ldkv, ldkv, 1.0f, dqb + qi * lddq,
             lddq);                                                                                                // dQ
        gemm(true, false, t.kn, hs, t.qn, scale, ds + at, Tk, qb + qi * ldq, ldq, 1.0f, dkb + ki * lddkv, lddkv);  // dK
      }
    }
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
