// A mixture of experts' routing written from its definition, in double, for tests that
// must not share code with the router they check (backend/moe_router_rule.hpp): scores
// (softmax probabilities or sigmoid scores), the top k by score plus bias (ties to the lower
// expert, by a stable sort), combine weights (renormalised over the chosen scores when asked),
// each expert's first ceil(capacity_factor N k / E) choices in token order kept, the rest
// dropped; the load-balancing loss E Σ_e f_e P_e and the z-loss mean(logsumexp²).
#pragma once
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "pipetrain/backend/moe_routing.hpp"

namespace pipetrain::testing {

struct ReferenceRouting {
  std::vector<int> expert;      // (N, k), best first
  std::vector<double> weight;   // (N, k)
  std::vector<bool> kept;       // (N, k): false where the capacity dropped the choice
  std::vector<int> load;        // (E): choices per expert before any drop
  double load_balance = 0, z = 0;
};

inline ReferenceRouting reference_routing(const std::vector<float>& logits, const std::vector<float>& bias, int N,
                                          const RouterSpec& spec) {
  const int E = spec.experts, k = spec.top_k;
  ReferenceRouting r;
  r.load.assign(static_cast<size_t>(E), 0);
  std::vector<double> mean_p(static_cast<size_t>(E), 0.0);
  std::vector<int> taken(static_cast<size_t>(E), 0);
  const double cap = spec.capacity_factor > 0 ? std::ceil(spec.capacity_factor * N * k / E) : 1e300;
  for (int t = 0; t < N; ++t) {
    const float* l = logits.data() + static_cast<size_t>(t) * E;
    const double top = *std::max_element(l, l + E);
    double sum_exp = 0;
    for (int e = 0; e < E; ++e) sum_exp += std::exp(double(l[e]) - top);
    const double lse = top + std::log(sum_exp);
    r.z += lse * lse / N;
    std::vector<double> s(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e)
      s[e] = spec.kind == RouterKind::Softmax ? std::exp(double(l[e]) - lse) : 1.0 / (1.0 + std::exp(-double(l[e])));
    const double s_sum = std::accumulate(s.begin(), s.end(), 0.0);
    for (int e = 0; e < E; ++e) mean_p[e] += (spec.kind == RouterKind::Softmax ? s[e] : s[e] / s_sum) / N;
    std::vector<int> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    auto key = [&](int e) { return s[e] + (bias.empty() ? 0.0 : double(bias[e])); };
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return key(a) > key(b); });
    double chosen = 0;
    for (int j = 0; j < k; ++j) chosen += s[order[j]];
    for (int j = 0; j < k; ++j) {
      const int e = order[j];
      r.expert.push_back(e);
      r.weight.push_back(spec.renormalize ? s[e] / chosen : s[e]);
      r.kept.push_back(taken[e]++ < cap);
      ++r.load[e];
    }
  }
  for (int e = 0; e < E; ++e) r.load_balance += E * (r.load[e] / (double(N) * k)) * mean_p[e];
  return r;
}

}  // namespace pipetrain::testing
