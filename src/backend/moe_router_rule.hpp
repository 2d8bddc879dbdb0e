// The router's rule, one token or one expert at a time (pipetrain/backend/moe_routing.hpp):
// what the CPU backend (backend/cpu/moe_routing.cpp) and the CUDA backend
// (backend/cuda/moe_routing.cu) both compile, so the two cannot drift. Every sum is in
// double, in a fixed order; each float result is rounded once from its double. Neither
// contracts a multiply-add (-ffp-contract=off, -fmad=false), so the two differ only where
// the device's exp and log differ from the host's (by an ulp of double at most): a score
// may then round to the neighbouring float.
#pragma once
#include <math.h>  // ::exp, ::log on the host; nvcc maps them to the device's

#include <cstdint>

#include "host_device.hpp"
#include "pipetrain/backend/moe_routing.hpp"

namespace pipetrain::router_rule {

PIPETRAIN_HOST_DEVICE inline double log_sum_exp(const float* l, int E) {
  double m = l[0];
  for (int e = 1; e < E; ++e)
    if (l[e] > m) m = l[e];
  double s = 0;
  for (int e = 0; e < E; ++e) s += ::exp(l[e] - m);
  return m + ::log(s);
}

// A token's scores from its logits: softmax probabilities or sigmoid scores. Returns the
// logits' log-sum-exp (the z-loss's).
PIPETRAIN_HOST_DEVICE inline double score_row(const float* l, int E, RouterKind kind, float* out) {
  const double lse = log_sum_exp(l, E);
  if (kind == RouterKind::Sigmoid) {
    for (int e = 0; e < E; ++e) out[e] = static_cast<float>(1.0 / (1.0 + ::exp(-static_cast<double>(l[e]))));
    return lse;
  }
  for (int e = 0; e < E; ++e) out[e] = static_cast<float>(::exp(l[e] - lse));
  return lse;
}

PIPETRAIN_HOST_DEVICE inline double score_sum(const float* s, int E) {
  double sum = 0;
  for (int e = 0; e < E; ++e) sum += s[e];
  return sum;
}

// The probability the load-balancing loss averages: softmax's own; a sigmoid score over the
// token's sum of scores (ssum).
PIPETRAIN_HOST_DEVICE inline double balance_prob(float s, double ssum, RouterKind kind) {
  return kind == RouterKind::Sigmoid ? s / ssum : static_cast<double>(s);
}

// Expert e's key for the top k: its score plus the selection bias. A NaN (a diverged router)
// ranks last, so a choice is always found.
PIPETRAIN_HOST_DEVICE inline double choice_key(const float* s, const float* bias, int e) {
  const double key = static_cast<double>(s[e]) + (bias ? bias[e] : 0.0);
  return key == key ? key : -1.7976931348623157e308;  // the lowest double
}

// The k best of a token's keys, best first, ties to the lower expert index: one pass in
// expert order, each expert inserted into the sorted list of the best so far, after any of
// an equal key (so the lower index stays first).
PIPETRAIN_HOST_DEVICE inline void choose_top_k(const float* s, const float* bias, int E, int k, int32_t* chosen) {
  int n = 0;
  for (int e = 0; e < E; ++e) {
    const double key = choice_key(s, bias, e);
    if (n == k && !(key > choice_key(s, bias, chosen[k - 1]))) continue;
    int i = n < k ? n++ : k - 1;
    for (; i > 0 && key > choice_key(s, bias, chosen[i - 1]); --i) chosen[i] = chosen[i - 1];
    chosen[i] = e;
  }
}

// Benchmarks' forced balance: token t's j-th choice is expert (t k + j) mod E.
PIPETRAIN_HOST_DEVICE inline void choose_round_robin(int64_t t, int E, int k, int32_t* chosen) {
  for (int j = 0; j < k; ++j) chosen[j] = static_cast<int32_t>((t * k + j) % E);
}

PIPETRAIN_HOST_DEVICE inline double chosen_sum(const float* s, const int32_t* chosen, int k) {
  double sum = 0;
  for (int j = 0; j < k; ++j) sum += s[chosen[j]];
  return sum;
}

// The combine weights: the chosen scores, over their sum when renormalised.
PIPETRAIN_HOST_DEVICE inline void combine_weights(const float* s, const int32_t* chosen, int k, bool renormalize,
                                                  float* w) {
  const double sum = chosen_sum(s, chosen, k);
  for (int j = 0; j < k; ++j) w[j] = static_cast<float>(renormalize ? s[chosen[j]] / sum : s[chosen[j]]);
}

// From each expert's routed rows in token order (count): the offsets before any drop
// (chosen) and after the capacity `cap` (kept); returns the rows dropped.
PIPETRAIN_HOST_DEVICE inline int offsets_from_counts(const int32_t* count, int E, int cap, int32_t* chosen,
                                                     int32_t* kept) {
  chosen[0] = kept[0] = 0;
  for (int e = 0; e < E; ++e) {
    chosen[e + 1] = chosen[e] + count[e];
    kept[e + 1] = kept[e] + (count[e] < cap ? count[e] : cap);
  }
  return chosen[E] - kept[E];
}

// The sorted row of a choice of expert e, the pos-th of e's in token order: -1 past the
// capacity.
PIPETRAIN_HOST_DEVICE inline int32_t placed_row(int32_t pos, int32_t e, int cap, const int32_t* kept) {
  return pos < cap ? kept[e] + pos : -1;
}

// E · Σ_e f_e P_e, from the loads before any drop and the mean balance probabilities.
PIPETRAIN_HOST_DEVICE inline double load_balance(const int32_t* count, const double* mean_p, int E, int N, int k) {
  double lb = 0;
  if (N == 0) return lb;  // an empty microbatch
  for (int e = 0; e < E; ++e) lb += E * (count[e] / (static_cast<double>(N) * k)) * mean_p[e];
  return lb;
}

// One token's router backward (moe_routing.hpp: router_backward): what a token needs.
struct BackwardToken {
  const float *l, *s, *dw;  // its logits and scores (E), its weights' gradient (k)
  const int32_t* chosen;    // its experts (k)
};
struct BackwardShape {
  const int32_t* offsets;  // the chosen offsets (E + 1): the loads
  int N, E, k;
  RouterSpec spec;
  double scale;
};

// d(objective)/d(P_e) of the load-balancing loss for one token: scale · coefficient · E f_e / N.
PIPETRAIN_HOST_DEVICE inline double balance_grad(const BackwardShape& b, int e) {
  const double load = b.offsets[e + 1] - b.offsets[e];
  return b.scale * b.spec.aux_loss * b.E * (load / (static_cast<double>(b.N) * b.k)) / b.N;
}

// d(objective)/d(score e): the combine weights' part plus the load-balancing loss's.
// sum, dot: the chosen scores' sum and Σ_j dw_j s_j / sum; ssum, pd: the token's sum of
// scores and Σ_e dp_e s_e / ssum (sigmoid only).
PIPETRAIN_HOST_DEVICE inline double score_grad(const BackwardToken& t, const BackwardShape& b, int e, double sum,
                                               double dot, double ssum, double pd) {
  double ds = 0;
  for (int j = 0; j < b.k; ++j)
    if (t.chosen[j] == e) ds += b.spec.renormalize ? (t.dw[j] - dot) / sum : t.dw[j];
  if (b.spec.aux_loss == 0) return ds;
  const double dp = balance_grad(b, e);
  return b.spec.kind == RouterKind::Sigmoid ? ds + (dp - pd) / ssum : ds + dp;
}

// Σ_e dp_e s_e / ssum: the sigmoid's normalisation in the load-balancing gradient.
PIPETRAIN_HOST_DEVICE inline double balance_dot(const BackwardToken& t, const BackwardShape& b, double ssum) {
  if (b.spec.aux_loss == 0 || b.spec.kind != RouterKind::Sigmoid) return 0;
  double pd = 0;
  for (int e = 0; e < b.E; ++e) pd += balance_grad(b, e) * t.s[e] / ssum;
  return pd;
}

// dl (E): the token's logits' gradient, through softmax's Jacobian or sigmoid's s (1 - s),
// plus the z-loss's 2 lse / N · softmax(l).
PIPETRAIN_HOST_DEVICE inline void backward_token(const BackwardToken& t, const BackwardShape& b, float* dl) {
  const double sum = chosen_sum(t.s, t.chosen, b.k);
  double dot = 0;
  for (int j = 0; j < b.k; ++j) dot += t.dw[j] * (t.s[t.chosen[j]] / sum);
  const double ssum = b.spec.kind == RouterKind::Sigmoid ? score_sum(t.s, b.E) : 1.0;
  const double pd = balance_dot(t, b, ssum);
  if (b.spec.kind == RouterKind::Softmax) {
    double sd = 0;
    for (int e = 0; e < b.E; ++e) sd += score_grad(t, b, e, sum, dot, ssum, pd) * t.s[e];
    for (int e = 0; e < b.E; ++e) dl[e] = static_cast<float>(t.s[e] * (score_grad(t, b, e, sum, dot, ssum, pd) - sd));
  } else {
    for (int e = 0; e < b.E; ++e)
      dl[e] = static_cast<float>(score_grad(t, b, e, sum, dot, ssum, pd) * t.s[e] * (1.0 - t.s[e]));
  }
  if (b.spec.z_loss != 0) {
    const double lse = log_sum_exp(t.l, b.E), c = b.scale * b.spec.z_loss * 2.0 * lse / b.N;
    for (int e = 0; e < b.E; ++e) dl[e] += static_cast<float>(c * ::exp(t.l[e] - lse));
  }
}

}  // namespace pipetrain::router_rule
