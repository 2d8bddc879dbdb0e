// Attention of queries against one block of keys and values with global positions, flash
// style (context parallelism's ring, model/ring_attention.hpp): the forward gives the
// block's output normalized within the block and the log-sum-exp of its visible scores,
// which the ring merges block by block; the backward recomputes each block's probabilities
// from the merged log-sum-exp (exp(S - lse): nothing of T x T is kept between the passes)
// and accumulates dQ and the block's dK and dV. Per (sequence, head) and block of kAttnBlock
// queries, two sgemms forward and five backward with a row kernel between them, the block's
// scores staying in cache; query and key runs of consecutive positions (a context-parallel
// rank's chunks) multiply only where some key of the pair is visible.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu_kernels.hpp"

namespace pipetrain::cpu {
namespace {

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

// Keys [k0, k0 + kn) of a block: the only columns of a row its products write and read.
struct Segment {
  int k0, kn;
};

// Masks s[0, n) to the visible keys (qstart <= kpos[j] <= qpos) and returns their max.
PIPETRAIN_SIMD_CLONES
float masked_max(float* s, const int32_t* kpos, int32_t qpos, int32_t qstart, int n) {
  float m = kMinusInf;
  for (int j = 0; j < n; ++j) {
    const float x = kpos[j] <= qpos && kpos[j] >= qstart ? s[j] : kMinusInf;
    s[j] = x;
    m = x > m ? x : m;
  }
  return m;
}

// s[j] = exp(s[j] - m) (0 where masked), returning their sum (fast_expf and kLanes partial
// sums, as the causal kernel's softmax).
PIPETRAIN_SIMD_CLONES
float exp_sum(float* s, float m, int n) {
  float sums[kLanes] = {};
  int c = 0;
  for (; c + kLanes <= n; c += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      const float e = s[c + j] == kMinusInf ? 0.0f : fast_expf(s[c + j] - m);
      s[c + j] = e;
      sums[j] += e;
    }
  float sum = 0.0f;
  for (; c < n; ++c) {
    const float e = s[c] == kMinusInf ? 0.0f : fast_expf(s[c] - m);
    s[c] = e;
    sum += e;
  }
  for (int j = 0; j < kLanes; ++j) sum += sums[j];
  return sum;
}

// The softmax of a row's scores over its block's key segments, masked to the visible keys;
// returns the log-sum-exp (-inf with no visible key: the row's segments are all 0). Columns
// outside the segments are neither read nor written.
float block_softmax_row(float* s, const int32_t* kpos, int32_t qpos, int32_t qstart, const Segment* segs, int nseg) {
  float m = kMinusInf;
  for (int g = 0; g < nseg; ++g)
    m = std::max(m, masked_max(s + segs[g].k0, kpos + segs[g].k0, qpos, qstart, segs[g].kn));
  if (m == kMinusInf) {
    for (int g = 0; g < nseg; ++g) std::fill_n(s + segs[g].k0, segs[g].kn, 0.0f);
    return kMinusInf;
  }
  float sum = 0.0f;
  for (int g = 0; g < nseg; ++g) sum += exp_sum(s + segs[g].k0, m, segs[g].kn);
  const float inv = 1.0f / sum;
  for (int g = 0; g < nseg; ++g)
    for (int j = segs[g].k0; j < segs[g].k0 + segs[g].kn; ++j) s[j] *= inv;
  return m + std::log(sum);
}

// A row of the backward over keys [0, n): p = exp(S - lse) (the merged softmax's
// probability) over the visible keys, dS = p (dP - delta) (the scale goes into the
// products), 0 elsewhere.
PIPETRAIN_SIMD_CLONES
void block_backward_row(float* p, float* ds, const int32_t* kpos, int32_t qpos, int32_t qstart, float lse, float delta,
                        int n) {
  if (lse == kMinusInf) {
    for (int j = 0; j < n; ++j) p[j] = ds[j] = 0.0f;
    return;
  }
  for (int j = 0; j < n; ++j) {
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

// The products of one block of at most kAttnBlock consecutive queries of a run: the keys of
// each key run some query of the block may see (a whole run, or on the causal diagonal the
// keys up to the block's last query), as the causal kernel's blocks. One block's scores
// (kAttnBlock x Tk floats) stay in cache between its products and its row kernel.
struct QueryBlock {
  int q0, qn;
  std::vector<Segment> keys;
};

std::vector<QueryBlock> blocks_of(const std::vector<Run>& queries, const std::vector<Run>& keys) {
  std::vector<QueryBlock> blocks;
  for (const Run& r : queries)
    for (int q0 = r.first; q0 < r.first + r.n; q0 += kAttnBlock) {
      QueryBlock qb{q0, std::min(kAttnBlock, r.first + r.n - q0), {}};
      const int64_t last = int64_t{r.lo} + (q0 - r.first) + qb.qn - 1;  // the block's last query position
      for (const Run& c : keys) {
        const int kn = static_cast<int>(std::min<int64_t>(c.n, last - c.lo + 1));
        if (kn > 0) qb.keys.push_back({c.first, kn});
      }
      if (!qb.keys.empty()) blocks.push_back(std::move(qb));
    }
  return blocks;
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
    const std::vector<QueryBlock> blocks = blocks_of(runs_of(qp, Tq), runs_of(kp, Tk));
    for (int h = 0; h < NH; ++h) {
      const float* qb = q + static_cast<int64_t>(b) * Tq * ldq + h * hs;
      const float* kb = k + static_cast<int64_t>(b) * Tk * ldkv + (h / group) * hs;
      const float* vb = v + static_cast<int64_t>(b) * Tk * ldkv + (h / group) * hs;
      float* ob = out + static_cast<int64_t>(b) * Tq * ldo + h * hs;
      float* l = lse + (static_cast<int64_t>(b) * NH + h) * Tq;
      for (int i = 0; i < Tq; ++i) {  // rows no block covers see nothing
        l[i] = kMinusInf;
        for (int d = 0; d < hs; ++d) ob[int64_t{i} * ldo + d] = 0.0f;
      }
      for (const QueryBlock& blk : blocks) {
        for (const Segment& g : blk.keys)  // S = scale Q K^T
          gemm(false, true, blk.qn, g.kn, hs, scale, qb + int64_t{blk.q0} * ldq, ldq, kb + int64_t{g.k0} * ldkv, ldkv,
               0.0f, scores + g.k0, Tk);
        const Segment* segs = blk.keys.data();
        const int q0 = blk.q0, nseg = static_cast<int>(blk.keys.size());
        Kokkos::parallel_for("pipetrain::attention_block_softmax", HostRange(0, blk.qn), [=](const int64_t i) {
          const int64_t at = q0 + i;
          l[at] = block_softmax_row(scores + i * Tk, kp, qp[at], qs ? qs[at] : 0, segs, nseg);
        });
        for (const Segment& g : blk.keys)  // O = P V
          gemm(false, false, blk.qn, hs, g.kn, 1.0f, scores + g.k0, Tk, vb + int64_t{g.k0} * ldkv, ldkv, 1.0f,
               ob + int64_t{blk.q0} * ldo, ldo);
      }
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
    const std::vector<QueryBlock> blocks = blocks_of(runs_of(qp, Tq), runs_of(kp, Tk));
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
      for (const QueryBlock& blk : blocks) {
        const int64_t qi = blk.q0;
        for (const Segment& g : blk.keys) {
          gemm(false, true, blk.qn, g.kn, hs, scale, qb + qi * ldq, ldq, kb + int64_t{g.k0} * ldkv, ldkv, 0.0f,
               p + g.k0, Tk);  // S
          gemm(false, true, blk.qn, g.kn, hs, 1.0f, dO + qi * ldo, ldo, vb + int64_t{g.k0} * ldkv, ldkv, 0.0f,
               ds + g.k0, Tk);  // dP = dO V^T
        }
        const Segment* segs = blk.keys.data();
        const int nseg = static_cast<int>(blk.keys.size());
        Kokkos::parallel_for("pipetrain::attention_block_backward_row", HostRange(0, blk.qn), [=](const int64_t i) {
          const int64_t at = qi + i, row = i * Tk;
          for (int g = 0; g < nseg; ++g) {
            const int k0 = segs[g].k0;
            block_backward_row(p + row + k0, ds + row + k0, kp + k0, qp[at], qs ? qs[at] : 0, l[at], D[at], segs[g].kn);
          }
        });
        for (const Segment& g : blk.keys) {
          const int64_t ki = g.k0;
          gemm(true, false, g.kn, hs, blk.qn, 1.0f, p + ki, Tk, dO + qi * ldo, ldo, 1.0f, dvb + ki * lddkv,
               lddkv);  // dV
          gemm(false, false, blk.qn, hs, g.kn, scale, ds + ki, Tk, kb + ki * ldkv, ldkv, 1.0f, dqb + qi * lddq,
               lddq);  // dQ
          gemm(true, false, g.kn, hs, blk.qn, scale, ds + ki, Tk, qb + qi * ldq, ldq, 1.0f, dkb + ki * lddkv,
               lddkv);  // dK
        }
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
