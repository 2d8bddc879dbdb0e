// Naive, obviously-correct reference implementations of every backend kernel
// (host vectors, double accumulation) and a few host-side helpers. The harness
// (test_kernels.cpp) checks every backend against these. Semantics follow
// include/pipetrain/backend/backend.hpp; nothing here is tuned for speed.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numbers>
#include <random>
#include <vector>

namespace pipetrain::ref {

using Vec = std::vector<float>;
using DVec = std::vector<double>;

// ---- host-side helpers for building inputs and comparing results ----

inline Vec random_vec(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  Vec v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

template <class R>
double max_abs(const R& r) {
  double m = 0.0;
  for (auto x : r) m = std::max(m, std::abs(static_cast<double>(x)));
  return m;
}

// a + b elementwise, in double (expected values of accumulating kernels).
template <class R>
DVec plus(const R& a, const DVec& b) {
  DVec r(b.size());
  for (size_t i = 0; i < b.size(); ++i) r[i] = static_cast<double>(a[i]) + b[i];
  return r;
}

// sum(a * b) in double: the scalar loss L = sum(out * R) of the gradient checks.
inline double dot(const Vec& a, const Vec& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// ---- reference kernels ----

// C = alpha * op(A) * op(B) + beta * C (row-major, leading dimensions given).
inline void gemm(bool ta, bool tb, int M, int N, int K, double alpha, const float* A, int lda,
                 const float* B, int ldb, double beta, const float* C_in, float* C, int ldc) {
  for (int i = 0; i < M; ++i) {
    for (int j = 0; j < N; ++j) {
      double s = 0.0;
      for (int k = 0; k < K; ++k) {
        const double a = ta ? A[static_cast<long>(k) * lda + i] : A[static_cast<long>(i) * lda + k];
        const double b = tb ? B[static_cast<long>(j) * ldb + k] : B[static_cast<long>(k) * ldb + j];
        s += a * b;
      }
      const long idx = static_cast<long>(i) * ldc + j;
      C[idx] = static_cast<float>(alpha * s + beta * C_in[idx]);
    }
  }
}

inline double gelu(double x) {
  const double u = std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x);
  return 0.5 * x * (1.0 + std::tanh(u));
}
inline double gelu_grad(double x) {
  const double u = std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x);
  const double du = std::sqrt(2.0 / std::numbers::pi) * (1.0 + 3.0 * 0.044715 * x * x);
  const double th = std::tanh(u);
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * du;
}

// out, mean, rstd as the backend's layernorm_forward.
inline void layernorm_forward(DVec& out, DVec& mean, DVec& rstd, const Vec& inp, const Vec& w,
                              const Vec& b, int N, int C, double eps) {
  out.assign(static_cast<size_t>(N) * C, 0.0);
  mean.assign(N, 0.0);
  rstd.assign(N, 0.0);
  for (int n = 0; n < N; ++n) {
    const float* x = &inp[static_cast<size_t>(n) * C];
    double m = 0.0;
    for (int c = 0; c < C; ++c) m += x[c];
    m /= C;
    double var = 0.0;
    for (int c = 0; c < C; ++c) var += (x[c] - m) * (x[c] - m);
    var /= C;
    const double r = 1.0 / std::sqrt(var + eps);
    for (int c = 0; c < C; ++c) out[static_cast<size_t>(n) * C + c] = (x[c] - m) * r * w[c] + b[c];
    mean[n] = m;
    rstd[n] = r;
  }
}

// Gradients of L = sum(out * dout) for LayerNorm (mean and rstd recomputed in
// double); the caller adds them to whatever the kernel is supposed to accumulate into.
inline void layernorm_backward(DVec& dinp, DVec& dw, DVec& db, const Vec& dout, const Vec& inp,
                               const Vec& w, int N, int C, double eps) {
  dinp.assign(static_cast<size_t>(N) * C, 0.0);
  dw.assign(C, 0.0);
  db.assign(C, 0.0);
  for (int n = 0; n < N; ++n) {
    const float* x = &inp[static_cast<size_t>(n) * C];
    const float* d = &dout[static_cast<size_t>(n) * C];
    double m = 0.0;
    for (int c = 0; c < C; ++c) m += x[c];
    m /= C;
    double var = 0.0;
    for (int c = 0; c < C; ++c) var += (x[c] - m) * (x[c] - m);
    var /= C;
    const double r = 1.0 / std::sqrt(var + eps);
    double mean_dn = 0.0, mean_dn_xhat = 0.0;
    for (int c = 0; c < C; ++c) {
      const double xhat = (x[c] - m) * r;
      const double dn = static_cast<double>(w[c]) * d[c];
      mean_dn += dn / C;
      mean_dn_xhat += dn * xhat / C;
      dw[c] += d[c] * xhat;
      db[c] += d[c];
    }
    for (int c = 0; c < C; ++c) {
      const double xhat = (x[c] - m) * r;
      const double dn = static_cast<double>(w[c]) * d[c];
      dinp[static_cast<size_t>(n) * C + c] = (dn - mean_dn - xhat * mean_dn_xhat) * r;
    }
  }
}

// Causal attention, explicit mask and softmax. att_out: (B, NH, T, T) with 0
// above the diagonal.
// Where element e of query head h's part (0 = Q, 1 = K, 2 = V) lies in a (B, T, C + 2 NKV hs)
// qkv: K and V of query head h are those of key/value head h / (NH / NKV).
inline size_t qkv_index(int b, int t, int part, int h, int e, int T, int C, int NH, int NKV) {
  const int hs = C / NH, Ckv = NKV * hs, R = C + 2 * Ckv;
  const int at = part == 0 ? h * hs : C + (part == 2 ? Ckv : 0) + (h / (NH / NKV)) * hs;
  return (static_cast<size_t>(b) * T + t) * R + at + e;
}

inline void attention_forward(DVec& out, DVec& att, const Vec& qkv, int B, int T, int C, int NH, int NKV = 0) {
  if (NKV == 0) NKV = NH;
  const int hs = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  out.assign(static_cast<size_t>(B) * T * C, 0.0);
  att.assign(static_cast<size_t>(B) * NH * T * T, 0.0);
  auto at = [&](int b, int t, int part, int h, int i) {
    return static_cast<double>(qkv[qkv_index(b, t, part, h, i, T, C, NH, NKV)]);
  };
  std::vector<double> s(T);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int i = 0; i < T; ++i) {
        double mx = -std::numeric_limits<double>::infinity();
        for (int j = 0; j < T; ++j) {
          if (j > i) {
            s[j] = -std::numeric_limits<double>::infinity();
            continue;
          }
          double dot = 0.0;
          for (int e = 0; e < hs; ++e) dot += at(b, i, 0, h, e) * at(b, j, 1, h, e);
          s[j] = dot * scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0.0;
        for (int j = 0; j < T; ++j) {
          s[j] = std::exp(s[j] - mx);  // exp(-inf) = 0 for masked entries
          sum += s[j];
        }
        double* arow = &att[((static_cast<size_t>(b) * NH + h) * T + i) * T];
        for (int j = 0; j < T; ++j) arow[j] = s[j] / sum;
        for (int e = 0; e < hs; ++e) {
          double o = 0.0;
          for (int j = 0; j < T; ++j) o += arow[j] * at(b, j, 2, h, e);
          out[(static_cast<size_t>(b) * T + i) * C + h * hs + e] = o;
        }
      }
    }
  }
}

// dqkv of L = sum(out * dout) for the attention above (probabilities recomputed in double).
inline void attention_backward(DVec& dqkv, const Vec& dout, const Vec& qkv, int B, int T, int C,
                               int NH, int NKV = 0) {
  if (NKV == 0) NKV = NH;
  const int hs = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  DVec out, att;
  attention_forward(out, att, qkv, B, T, C, NH, NKV);
  dqkv.assign(qkv.size(), 0.0);
  auto idx = [&](int b, int t, int part, int h, int e) { return qkv_index(b, t, part, h, e, T, C, NH, NKV); };
  std::vector<double> dp(T), ds(T);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int i = 0; i < T; ++i) {
        const double* p = &att[((static_cast<size_t>(b) * NH + h) * T + i) * T];
        const float* d = &dout[(static_cast<size_t>(b) * T + i) * C + h * hs];
        double dot = 0.0;
        for (int j = 0; j <= i; ++j) {
          dp[j] = 0.0;
          for (int e = 0; e < hs; ++e) dp[j] += d[e] * static_cast<double>(qkv[idx(b, j, 2, h, e)]);
          dot += p[j] * dp[j];
          for (int e = 0; e < hs; ++e) dqkv[idx(b, j, 2, h, e)] += p[j] * d[e];
        }
        for (int j = 0; j <= i; ++j) {
          ds[j] = p[j] * (dp[j] - dot) * scale;
          for (int e = 0; e < hs; ++e) {
            dqkv[idx(b, i, 0, h, e)] += ds[j] * qkv[idx(b, j, 1, h, e)];
            dqkv[idx(b, j, 1, h, e)] += ds[j] * qkv[idx(b, i, 0, h, e)];
          }
        }
      }
    }
  }
}

// What bounds attention's error when its products take bf16 operands (P, dO and dS
// rounded once each, relative error u = 2^-9 per rounding; q, k, v already bf16), per
// element, as the sum of |term| its error is a multiple of:
//   out_i  = sum_j P_ij v_j:          |err| <= u sum_j P_ij |v_j|
//   dV_j   = sum_i P_ij dO_i:         |err| <= 2u sum_i P_ij |dO_i|
//   dS_ij  = scale P_ij (dP_ij - D_i), dP_ij = dO_i . v_j, D_i = sum_j P_ij dP_ij: with
//            A_ij = |dO_i| . |v_j| >= |dP_ij| and Abar_i = sum_j P_ij A_ij, each rounding
//            (P, dO, then dS itself) adds at most u scale P_ij (A_ij + Abar_i) per use:
//            |err(dS_ij)| <= 4u m_ij, m_ij = scale P_ij (A_ij + Abar_i)
//   dQ_i   = sum_j dS_ij k_j:         |err| <= 4u sum_j m_ij |k_j|
//   dK_j   = sum_i dS_ij q_i:         |err| <= 4u sum_i m_ij |q_i|
// Returned without the factor: every error is <= 4u times its bound.
inline void attention_bf16_bounds(DVec& out_bound, DVec& dqkv_bound, const Vec& dout, const Vec& qkv, int B, int T,
                                  int C, int NH, int NKV = 0) {
  if (NKV == 0) NKV = NH;
  const int hs = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  DVec out, att;
  attention_forward(out, att, qkv, B, T, C, NH, NKV);
  out_bound.assign(out.size(), 0.0);
  dqkv_bound.assign(qkv.size(), 0.0);
  auto q = [&](int b, int t, int part, int h, int e) {
    return std::abs(static_cast<double>(qkv[qkv_index(b, t, part, h, e, T, C, NH, NKV)]));
  };
  auto idx = [&](int b, int t, int part, int h, int e) { return qkv_index(b, t, part, h, e, T, C, NH, NKV); };
  std::vector<double> a(T);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int i = 0; i < T; ++i) {
        const double* p = &att[((static_cast<size_t>(b) * NH + h) * T + i) * T];
        const float* d = &dout[(static_cast<size_t>(b) * T + i) * C + h * hs];
        double abar = 0.0;
        for (int j = 0; j <= i; ++j) {
          a[j] = 0.0;
          for (int e = 0; e < hs; ++e) a[j] += std::abs(static_cast<double>(d[e])) * q(b, j, 2, h, e);
          abar += p[j] * a[j];
          for (int e = 0; e < hs; ++e) {
            out_bound[(static_cast<size_t>(b) * T + i) * C + h * hs + e] += p[j] * q(b, j, 2, h, e);
            dqkv_bound[idx(b, j, 2, h, e)] += 2.0 * p[j] * std::abs(static_cast<double>(d[e]));
          }
        }
        for (int j = 0; j <= i; ++j) {
          const double m = scale * p[j] * (a[j] + abar);
          for (int e = 0; e < hs; ++e) {
            dqkv_bound[idx(b, i, 0, h, e)] += m * q(b, j, 1, h, e);
            dqkv_bound[idx(b, j, 1, h, e)] += m * q(b, i, 0, h, e);
          }
        }
      }
    }
  }
}

// losses and (unscaled) dlosses/dlogits; padded columns ignored.
inline void crossentropy(DVec& losses, DVec& grad, const Vec& logits, const std::vector<int32_t>& t,
                         int N, int V, int Vp) {
  losses.assign(N, 0.0);
  grad.assign(static_cast<size_t>(N) * Vp, 0.0);
  for (int n = 0; n < N; ++n) {
    const float* x = &logits[static_cast<size_t>(n) * Vp];
    double mx = x[0];
    for (int v = 1; v < V; ++v) mx = std::max(mx, static_cast<double>(x[v]));
    double sum = 0.0;
    for (int v = 0; v < V; ++v) sum += std::exp(x[v] - mx);
    losses[n] = -(x[t[n]] - mx - std::log(sum));
    for (int v = 0; v < V; ++v) {
      grad[static_cast<size_t>(n) * Vp + v] = std::exp(x[v] - mx) / sum - (v == t[n] ? 1.0 : 0.0);
    }
  }
}

inline void embedding_forward(DVec& out, const std::vector<int32_t>& tokens, const Vec& wte,
                              const Vec& wpe, int B, int T, int C) {
  out.assign(static_cast<size_t>(B) * T * C, 0.0);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c)
        out[(static_cast<size_t>(b) * T + t) * C + c] =
            static_cast<double>(wte[static_cast<size_t>(tokens[b * T + t]) * C + c]) +
            wpe[static_cast<size_t>(t) * C + c];
}

// Accumulates into dwte/dwpe (already holding the starting values).
inline void embedding_backward(DVec& dwte, DVec& dwpe, const Vec& dout,
                               const std::vector<int32_t>& tokens, int B, int T, int C) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c) {
        const double d = dout[(static_cast<size_t>(b) * T + t) * C + c];
        dwte[static_cast<size_t>(tokens[b * T + t]) * C + c] += d;
        dwpe[static_cast<size_t>(t) * C + c] += d;
      }
}

// ---- tensor-parallel kernels (vocabulary-sharded embedding, vocabulary-parallel
// cross-entropy); tokens/targets outside the shard contribute nothing ----

inline bool in_rows(int32_t tok, int row_begin, int row_end) {
  return tok >= row_begin && tok < row_end;
}

// out (overwritten) = the shard's embedding row of each token, or 0.
inline void embedding_lookup(DVec& out, const std::vector<int32_t>& tokens, const Vec& wte,
                             int row_begin, int row_end, int N, int C) {
  out.assign(static_cast<size_t>(N) * C, 0.0);
  for (int n = 0; n < N; ++n) {
    if (!in_rows(tokens[n], row_begin, row_end)) continue;
    for (int c = 0; c < C; ++c)
      out[static_cast<size_t>(n) * C + c] = wte[static_cast<size_t>(tokens[n] - row_begin) * C + c];
  }
}

// Accumulates into dwte (already holding the starting values).
inline void embedding_scatter(DVec& dwte, const Vec& dout, const std::vector<int32_t>& tokens,
                              int row_begin, int row_end, int N, int C) {
  for (int n = 0; n < N; ++n) {
    if (!in_rows(tokens[n], row_begin, row_end)) continue;
    for (int c = 0; c < C; ++c)
      dwte[static_cast<size_t>(tokens[n] - row_begin) * C + c] += dout[static_cast<size_t>(n) * C + c];
  }
}

// Accumulates wpe into out (already holding the starting values).
inline void position_add(DVec& out, const Vec& wpe, int B, int T, int C) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c)
        out[(static_cast<size_t>(b) * T + t) * C + c] += wpe[static_cast<size_t>(t) * C + c];
}

// Accumulates into dwpe (already holding the starting values).
inline void position_backward(DVec& dwpe, const Vec& dout, int B, int T, int C) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c)
        dwpe[static_cast<size_t>(t) * C + c] += dout[(static_cast<size_t>(b) * T + t) * C + c];
}

// Columns of a shard that are real: [0, nreal).
inline int real_columns(int Vl, int col_begin, int V) {
  return std::clamp(V - col_begin, 0, Vl);
}

// Phase 1: max over the shard's real columns, -inf if it has none.
inline void crossentropy_local_max(DVec& rowmax, const Vec& logits, int N, int Vl, int col_begin,
                                   int V) {
  rowmax.assign(N, -std::numeric_limits<double>::infinity());
  const int nreal = real_columns(Vl, col_begin, V);
  for (int n = 0; n < N; ++n)
    for (int v = 0; v < nreal; ++v)
      rowmax[n] = std::max(rowmax[n], static_cast<double>(logits[static_cast<size_t>(n) * Vl + v]));
}

// Phase 2 with the global rowmax: sum of exp over real columns, target logit or 0.
inline void crossentropy_local_sums(DVec& sumexp, DVec& target_logit, const Vec& logits,
                                    const Vec& rowmax, const std::vector<int32_t>& targets, int N,
                                    int Vl, int col_begin, int V) {
  sumexp.assign(N, 0.0);
  target_logit.assign(N, 0.0);
  const int nreal = real_columns(Vl, col_begin, V);
  for (int n = 0; n < N; ++n) {
    const float* x = &logits[static_cast<size_t>(n) * Vl];
    for (int v = 0; v < nreal; ++v) sumexp[n] += std::exp(static_cast<double>(x[v]) - rowmax[n]);
    const int local = targets[n] - col_begin;
    if (local >= 0 && local < nreal) target_logit[n] = x[local];
  }
}

// Phase 3 with the global sums: losses and the (scaled) gradient over the shard,
// 0 on its padding.
inline void crossentropy_finish(DVec& losses, DVec& grad, const Vec& logits, const Vec& rowmax,
                                const Vec& sumexp, const Vec& target_logit,
                                const std::vector<int32_t>& targets, int N, int Vl, int col_begin,
                                int V, double grad_scale) {
  losses.assign(N, 0.0);
  grad.assign(static_cast<size_t>(N) * Vl, 0.0);
  const int nreal = real_columns(Vl, col_begin, V);
  for (int n = 0; n < N; ++n) {
    const double m = rowmax[n], s = sumexp[n];
    losses[n] = std::log(s) + m - target_logit[n];
    for (int v = 0; v < nreal; ++v) {
      const double p = std::exp(logits[static_cast<size_t>(n) * Vl + v] - m) / s;
      grad[static_cast<size_t>(n) * Vl + v] =
          grad_scale * (p - (col_begin + v == targets[n] ? 1.0 : 0.0));
    }
  }
}

// One AdamW step in double, in place.
inline void adamw(DVec& p, const Vec& g_in, DVec& m, DVec& v, double lr, double b1, double b2,
                  double eps, double wd, int step, double grad_scale) {
  for (size_t i = 0; i < p.size(); ++i) {
    const double g = g_in[i] * grad_scale;
    m[i] = b1 * m[i] + (1.0 - b1) * g;
    v[i] = b2 * v[i] + (1.0 - b2) * g * g;
    const double mhat = m[i] / (1.0 - std::pow(b1, step));
    const double vhat = v[i] / (1.0 - std::pow(b2, step));
    p[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * p[i]);
  }
}

// ---- Llama references ----

// RMSNorm: out = x r w with r = 1 / sqrt(mean(x^2) + eps); backward by the chain rule.
inline void rmsnorm_forward(DVec& out, DVec& rstd, const Vec& x, const Vec& w, int N, int C, double eps) {
  out.assign(x.size(), 0.0);
  rstd.assign(static_cast<size_t>(N), 0.0);
  for (int n = 0; n < N; ++n) {
    double ss = 0;
    for (int c = 0; c < C; ++c) ss += static_cast<double>(x[size_t(n) * C + c]) * x[size_t(n) * C + c];
    const double r = 1.0 / std::sqrt(ss / C + eps);
    rstd[size_t(n)] = r;
    for (int c = 0; c < C; ++c) out[size_t(n) * C + c] = x[size_t(n) * C + c] * r * w[size_t(c)];
  }
}
inline void rmsnorm_backward(DVec& dx, DVec& dw, const Vec& dout, const Vec& x, const Vec& w, int N, int C,
                             double eps) {
  DVec out, rstd;
  rmsnorm_forward(out, rstd, x, w, N, C, eps);
  dx.assign(x.size(), 0.0);
  dw.assign(static_cast<size_t>(C), 0.0);
  for (int n = 0; n < N; ++n) {
    const double r = rstd[size_t(n)];
    double s = 0;  // sum_k d_k w_k x_k
    for (int c = 0; c < C; ++c) s += static_cast<double>(dout[size_t(n) * C + c]) * w[size_t(c)] * x[size_t(n) * C + c];
    for (int c = 0; c < C; ++c) {
      const size_t i = size_t(n) * C + c;
      dx[i] = r * dout[i] * w[size_t(c)] - r * r * r * x[i] * s / C;
      dw[size_t(c)] += dout[i] * x[i] * r;
    }
  }
}

// RoPE on the first heads * hs channels of each of the B*T rows (stride ld): pairs
// (2i, 2i+1) rotated by t * theta^(-2i/hs), t = row % T.
inline DVec rope(const Vec& x, int B, int T, int ld, int heads, int hs, double theta, bool inverse) {
  DVec y(x.begin(), x.end());
  for (int row = 0; row < B * T; ++row) {
    const int t = row % T;
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < hs / 2; ++i) {
        const double a = t * std::pow(theta, -2.0 * i / hs) * (inverse ? -1.0 : 1.0);
        const size_t k = size_t(row) * ld + h * hs + 2 * i;
        const double x0 = x[k], x1 = x[k + 1];
        y[k] = x0 * std::cos(a) - x1 * std::sin(a);
        y[k + 1] = x0 * std::sin(a) + x1 * std::cos(a);
      }
  }
  return y;
}

// SwiGLU: h = silu(g) u.
inline double silu(double g) { return g / (1.0 + std::exp(-g)); }
inline double silu_grad(double g) {
  const double s = 1.0 / (1.0 + std::exp(-g));
  return s * (1.0 + g * (1.0 - s));
}

}  // namespace pipetrain::ref
