// route_tokens, router_backward (pipetrain/model/moe_routing.hpp). Sums in double, in a
// fixed order: every layout routes and differentiates a microbatch identically.
#include "pipetrain/model/moe_routing.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "pipetrain/core/error.hpp"

namespace pipetrain {

namespace {

double log_sum_exp(const float* l, int E) {
  double m = l[0];
  for (int e = 1; e < E; ++e) m = std::max(m, static_cast<double>(l[e]));
  double s = 0;
  for (int e = 0; e < E; ++e) s += std::exp(l[e] - m);
  return m + std::log(s);
}

// Token t's scores: softmax probabilities or sigmoid scores.
void score_row(const float* l, int E, RouterKind kind, float* out) {
  if (kind == RouterKind::Sigmoid) {
    for (int e = 0; e < E; ++e) out[e] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(l[e]))));
    return;
  }
  const double lse = log_sum_exp(l, E);
  for (int e = 0; e < E; ++e) out[e] = static_cast<float>(std::exp(l[e] - lse));
}

// The probabilities the load-balancing loss averages: softmax's own, sigmoid scores over their sum.
std::vector<double> balance_probs(const float* s, int E, RouterKind kind) {
  std::vector<double> p(s, s + E);
  if (kind == RouterKind::Sigmoid) {
    const double sum = std::accumulate(p.begin(), p.end(), 0.0);
    for (double& x : p) x /= sum;
  }
  return p;
}

// The k best of token t's scores (plus bias), ties to the lower expert index.
void choose(const float* s, const float* bias, int E, int k, int32_t* chosen) {
  std::vector<int32_t> order(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  auto key = [&](int32_t e) { return static_cast<double>(s[e]) + (bias ? bias[e] : 0.0); };
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    const double ka = key(a), kb = key(b);
    return ka > kb || (ka == kb && a < b);
  });
  std::copy(order.begin(), order.begin() + k, chosen);
}

// Counting sort of the (token, choice) pairs by expert: rows, sources, offsets.
void sort_rows(Routing& r) {
  const int N = r.tokens, k = r.k, E = r.experts;
  std::vector<int32_t> count(static_cast<size_t>(E), 0);
  for (int32_t e : r.expert) ++count[static_cast<size_t>(e)];
  r.offset.assign(static_cast<size_t>(E) + 1, 0);
  for (int e = 0; e < E; ++e)
    r.offset[static_cast<size_t>(e) + 1] = r.offset[static_cast<size_t>(e)] + count[static_cast<size_t>(e)];
  std::vector<int32_t> next(r.offset.begin(), r.offset.end() - 1);
  r.row.resize(static_cast<size_t>(N) * k);
  r.source.resize(static_cast<size_t>(N) * k);
  r.row_weight.resize(static_cast<size_t>(N) * k);
  for (int t = 0; t < N; ++t)
    for (int j = 0; j < k; ++j) {
      const size_t tj = static_cast<size_t>(t) * k + j;
      const int32_t at = next[static_cast<size_t>(r.expert[tj])]++;
      r.row[tj] = at;
      r.source[static_cast<size_t>(at)] = t;
      r.row_weight[static_cast<size_t>(at)] = r.weight[tj];
    }
}

// Capacity: expert e keeps its first `cap` sorted rows (token order); the rest leave the
// layout (their choices' rows become -1) and the kept rows close up.
void drop_over_capacity(Routing& r, int cap) {
  std::vector<int32_t> renumber(r.source.size(), -1);
  std::vector<int32_t> offset(r.offset.size(), 0);
  int32_t kept = 0;
  for (int e = 0; e < r.experts; ++e) {
    const int32_t first = r.offset[static_cast<size_t>(e)];
    for (int32_t i = first; i < first + std::min(r.count(e), cap); ++i) renumber[static_cast<size_t>(i)] = kept++;
    offset[static_cast<size_t>(e) + 1] = kept;
  }
  std::vector<int32_t> source(static_cast<size_t>(kept));
  std::vector<float> row_weight(static_cast<size_t>(kept));
  for (size_t i = 0; i < renumber.size(); ++i)
    if (renumber[i] >= 0) {
      source[static_cast<size_t>(renumber[i])] = r.source[i];
      row_weight[static_cast<size_t>(renumber[i])] = r.row_weight[i];
    }
  for (int32_t& row : r.row) row = renumber[static_cast<size_t>(row)];
  r.dropped = static_cast<int>(r.source.size()) - kept;
  r.source = std::move(source);
  r.row_weight = std::move(row_weight);
  r.offset = std::move(offset);
}

}  // namespace

int expert_capacity(double capacity_factor, int N, int k, int E) {
  return static_cast<int>(std::ceil(capacity_factor * N * k / E));
}

double Routing::max_over_mean_load() const {
  if (experts == 0 || tokens == 0) return 0;
  int most = 0;
  for (int e = 0; e < experts; ++e) most = std::max(most, load(e));
  return most / (static_cast<double>(tokens) * k / experts);
}

Routing route_tokens(const float* logits, const float* bias, int N, const RouterSpec& spec) {
  const int E = spec.experts, k = spec.top_k;
  if (E < 1 || k < 1 || k > E) fail("route_tokens: top_k {} of {} experts", k, E);
  Routing r;
  r.tokens = N, r.k = k, r.experts = E;
  r.scores.resize(static_cast<size_t>(N) * E);
  r.expert.resize(static_cast<size_t>(N) * k);
  r.weight.resize(static_cast<size_t>(N) * k);
  std::vector<double> mean_p(static_cast<size_t>(E), 0.0);
  for (int t = 0; t < N; ++t) {
    const float* l = logits + static_cast<size_t>(t) * E;
    float* s = r.scores.data() + static_cast<size_t>(t) * E;
    score_row(l, E, spec.kind, s);
    int32_t* chosen = r.expert.data() + static_cast<size_t>(t) * k;
    if (spec.force_balance)
      for (int j = 0; j < k; ++j) chosen[j] = static_cast<int32_t>((static_cast<int64_t>(t) * k + j) % E);
    else
      choose(s, bias, E, k, chosen);
    double sum = 0;
    for (int j = 0; j < k; ++j) sum += s[chosen[j]];
    for (int j = 0; j < k; ++j)
      r.weight[static_cast<size_t>(t) * k + j] =
          static_cast<float>(spec.renormalize ? s[chosen[j]] / sum : s[chosen[j]]);
    const std::vector<double> p = balance_probs(s, E, spec.kind);
    for (int e = 0; e < E; ++e) mean_p[static_cast<size_t>(e)] += p[static_cast<size_t>(e)] / N;
    const double lse = log_sum_exp(l, E);
    r.z += lse * lse / N;
  }
  sort_rows(r);
  for (int e = 0; e < E; ++e)
    r.load_balance += E * (r.count(e) / (static_cast<double>(N) * k)) * mean_p[static_cast<size_t>(e)];
  // The router's choices before any drop: what the load-balancing loss and its gradient see.
  r.chosen.assign(r.offset.begin(), r.offset.end());
  if (spec.capacity_factor > 0) drop_over_capacity(r, expert_capacity(spec.capacity_factor, N, k, E));
  return r;
}

void router_backward(const Routing& r, const float* logits, const float* dweight, const RouterSpec& spec, double scale,
                     float* dlogits) {
  const int N = r.tokens, k = r.k, E = r.experts;
  std::vector<double> ds(static_cast<size_t>(E)), dp(static_cast<size_t>(E));
  for (int t = 0; t < N; ++t) {
    const float* s = r.scores.data() + static_cast<size_t>(t) * E;
    const int32_t* chosen = r.expert.data() + static_cast<size_t>(t) * k;
    const float* dw = dweight + static_cast<size_t>(t) * k;
    std::fill(ds.begin(), ds.end(), 0.0);
    // The combine weights: w_j = s_j (/ Σ_i s_i renormalised).
    double sum = 0, dot = 0;
    for (int j = 0; j < k; ++j) sum += s[chosen[j]];
    for (int j = 0; j < k; ++j) dot += dw[j] * (s[chosen[j]] / sum);
    for (int j = 0; j < k; ++j) ds[static_cast<size_t>(chosen[j])] += spec.renormalize ? (dw[j] - dot) / sum : dw[j];
    // Load balancing: d/dP_e = E f_e, P_e the mean over the N tokens of the (normalised) scores.
    if (spec.aux_loss != 0) {
      for (int e = 0; e < E; ++e)
        dp[static_cast<size_t>(e)] = scale * spec.aux_loss * E * (r.load(e) / (static_cast<double>(N) * k)) / N;
      if (spec.kind == RouterKind::Sigmoid) {  // p = s / Σ s
        double ssum = 0, pd = 0;
        for (int e = 0; e < E; ++e) ssum += s[e];
        for (int e = 0; e < E; ++e) pd += dp[static_cast<size_t>(e)] * s[e] / ssum;
        for (int e = 0; e < E; ++e) ds[static_cast<size_t>(e)] += (dp[static_cast<size_t>(e)] - pd) / ssum;
      } else {
        for (int e = 0; e < E; ++e) ds[static_cast<size_t>(e)] += dp[static_cast<size_t>(e)];
      }
    }
    // Through the scores: softmax's Jacobian, or sigmoid's s (1 - s).
    const float* l = logits + static_cast<size_t>(t) * E;
    float* dl = dlogits + static_cast<size_t>(t) * E;
    if (spec.kind == RouterKind::Softmax) {
      double sd = 0;
      for (int e = 0; e < E; ++e) sd += ds[static_cast<size_t>(e)] * s[e];
      for (int e = 0; e < E; ++e) dl[e] = static_cast<float>(s[e] * (ds[static_cast<size_t>(e)] - sd));
    } else {
      for (int e = 0; e < E; ++e) dl[e] = static_cast<float>(ds[static_cast<size_t>(e)] * s[e] * (1.0 - s[e]));
    }
    // z-loss: d/dl = 2 lse / N · softmax(l).
    if (spec.z_loss != 0) {
      const double lse = log_sum_exp(l, E), c = scale * spec.z_loss * 2.0 * lse / N;
      for (int e = 0; e < E; ++e) dl[e] += static_cast<float>(c * std::exp(l[e] - lse));
    }
  }
}

void update_selection_bias(float* bias, const double* loads, int experts, double rate) {
  double total = 0;
  for (int e = 0; e < experts; ++e) total += loads[e];
  const double mean = total / experts;
  for (int e = 0; e < experts; ++e)
    if (loads[e] != mean) bias[e] += static_cast<float>(loads[e] < mean ? rate : -rate);
}

}  // namespace pipetrain
