// route_into, route_tokens, router_backward, update_selection_bias
// (pipetrain/backend/moe_routing.hpp): the rule of ../moe_router_rule.hpp, token after
// token and expert after expert. The CPU backend's routing and every test's reference.
#include "pipetrain/backend/moe_routing.hpp"

#include <algorithm>
#include <climits>
#include <cmath>

#include "../moe_router_rule.hpp"
#include "pipetrain/core/error.hpp"

namespace pipetrain {

using namespace router_rule;

namespace {

// Scores, choices and weights of every token; the mean balance probabilities and the z-loss.
void score_and_choose(const RoutedArrays& out, const float* logits, const float* bias, int N, const RouterSpec& spec,
                      std::vector<double>& mean_p, double& z) {
  const int E = spec.experts, k = spec.top_k;
  for (int t = 0; t < N; ++t) {
    const float* l = logits + static_cast<size_t>(t) * E;
    float* s = out.scores + static_cast<size_t>(t) * E;
    int32_t* chosen = out.expert + static_cast<size_t>(t) * k;
    const double lse = score_row(l, E, spec.kind, s);
    if (spec.force_balance)
      choose_round_robin(t, E, k, chosen);
    else
      choose_top_k(s, bias, E, k, chosen);
    combine_weights(s, chosen, k, spec.renormalize, out.weight + static_cast<size_t>(t) * k);
    const double ssum = spec.kind == RouterKind::Sigmoid ? score_sum(s, E) : 1.0;
    for (int e = 0; e < E; ++e) mean_p[static_cast<size_t>(e)] += balance_prob(s[e], ssum, spec.kind) / N;
    z += lse * lse / N;
  }
}

}  // namespace

int expert_capacity(double capacity_factor, int N, int k, int E) {
  return static_cast<int>(std::ceil(capacity_factor * N * k / E));
}

int kept_rows_limit(const RouterSpec& spec, int N) {
  return spec.capacity_factor > 0 ? expert_capacity(spec.capacity_factor, N, spec.top_k, spec.experts) : INT_MAX;
}

double RouteCounts::max_over_mean_load() const {
  if (experts == 0 || tokens == 0) return 0;
  int most = 0;
  for (int e = 0; e < experts; ++e) most = std::max(most, load(e));
  return most / (static_cast<double>(tokens) * k / experts);
}

RouteCounts route_into(const RoutedArrays& out, const float* logits, const float* bias, int N, const RouterSpec& spec) {
  const int E = spec.experts, k = spec.top_k;
  if (E < 1 || k < 1 || k > E) fail("route_tokens: top_k {} of {} experts", k, E);
  RouteCounts r;
  r.tokens = N, r.k = k, r.experts = E;
  std::vector<double> mean_p(static_cast<size_t>(E), 0.0);
  score_and_choose(out, logits, bias, N, spec, mean_p, r.z);
  // Each choice's place among its expert's in token order, then the rows.
  const size_t pairs = static_cast<size_t>(N) * k;
  std::vector<int32_t> count(static_cast<size_t>(E), 0), pos(pairs);
  for (size_t tj = 0; tj < pairs; ++tj) pos[tj] = count[static_cast<size_t>(out.expert[tj])]++;
  const int cap = kept_rows_limit(spec, N);
  r.chosen.resize(static_cast<size_t>(E) + 1);
  r.offset.resize(static_cast<size_t>(E) + 1);
  r.dropped = offsets_from_counts(count.data(), E, cap, r.chosen.data(), r.offset.data());
  std::copy(r.chosen.begin(), r.chosen.end(), out.chosen);
  for (size_t tj = 0; tj < pairs; ++tj) {
    const int32_t row = placed_row(pos[tj], out.expert[tj], cap, r.offset.data());
    out.row[tj] = row;
    if (row < 0) continue;
    out.source[row] = static_cast<int32_t>(tj / static_cast<size_t>(k));
    out.row_weight[row] = out.weight[tj];
  }
  // The load-balancing loss sees the router's choices, before any drop.
  r.load_balance = load_balance(count.data(), mean_p.data(), E, N, k);
  return r;
}

Routing route_tokens(const float* logits, const float* bias, int N, const RouterSpec& spec) {
  const size_t E = static_cast<size_t>(std::max(spec.experts, 0)),
               pairs = static_cast<size_t>(N) * std::max(spec.top_k, 0);
  Routing r;
  r.scores.resize(static_cast<size_t>(N) * E);
  r.weight.resize(pairs), r.row_weight.resize(pairs);
  r.expert.resize(pairs), r.row.resize(pairs), r.source.resize(pairs);
  r.chosen.resize(E + 1);
  static_cast<RouteCounts&>(r) = route_into(r.arrays(), logits, bias, N, spec);
  r.source.resize(static_cast<size_t>(r.rows())), r.row_weight.resize(static_cast<size_t>(r.rows()));
  return r;
}

void router_backward(const float* scores, const int32_t* expert, const int32_t* chosen, const float* logits,
                     const float* dweight, int N, const RouterSpec& spec, double scale, float* dlogits) {
  const int E = spec.experts, k = spec.top_k;
  const BackwardShape shape{chosen, N, E, k, spec, scale};
  for (int t = 0; t < N; ++t) {
    const size_t te = static_cast<size_t>(t) * E, tk = static_cast<size_t>(t) * k;
    backward_token({logits + te, scores + te, dweight + tk, expert + tk}, shape, dlogits + te);
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
