// Token routing of a mixture-of-experts layer: the rule, stated once
// (src/backend/moe_router_rule.hpp) and compiled by both backends. The host's
// route_tokens is the CPU backend's kernel and every test's reference; the CUDA backend
// routes on the device (src/backend/cuda/moe_routing.cu) and copies only the counts and
// losses to the host (Backend::moe_route). Deterministic: each token's top k experts by
// score (plus the selection-only bias), ties to the lower expert index (benchmarks may
// force round robin instead); the routed rows sorted by expert, then token, then choice,
// so each expert's rows are contiguous and in token order.
//   softmax router (Mixtral, Qwen3-MoE): p = softmax(logits), weights p of the chosen;
//   sigmoid router (DeepSeek-V3): s = sigmoid(logits), weights s of the chosen;
//   either optionally renormalised: the k weights divided by their sum.
// Two auxiliary losses per microbatch: the Switch/GShard load-balancing loss
// E · Σ_e f_e P_e (f_e the share of routed rows on e, P_e the mean probability of e;
// sigmoid scores normalised per token first) and the router z-loss mean_t lse(logits_t)².
// The selection bias of DeepSeek-V3's auxiliary-loss-free balancing moves after each step by
// `rate` towards equal load: up for the experts below the mean, down for those above.
// Exports: RouterKind, RouterSpec, RoutedArrays, RouteCounts, Routing, expert_capacity,
// route_into, route_tokens, router_backward, update_selection_bias, kept_rows_limit.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace pipetrain {

enum class RouterKind { Softmax, Sigmoid };

struct RouterSpec {
  int experts = 0, top_k = 0;
  RouterKind kind = RouterKind::Softmax;
  bool renormalize = true;  // the k weights divided by their sum
  double aux_loss = 0;      // coefficient of the load-balancing loss
  double z_loss = 0;        // coefficient of the router z-loss
  // > 0: each expert takes at most ceil(capacity_factor N k / E) rows of a microbatch, its
  // first in token order; the choices beyond are dropped (the token keeps its residual).
  double capacity_factor = 0;
  // Benchmarks: token t's j-th choice is expert (t k + j) mod E whatever the scores (every
  // expert the same load when E divides N k), weighed by the scores of those experts.
  bool force_balance = false;
};

// Where routing writes a microbatch's per-token and per-row arrays, N tokens, E experts,
// top k (Backend::moe_route: on that backend's device).
struct RoutedArrays {
  float* scores;      // (N, E): softmax probabilities or sigmoid scores
  int32_t* expert;    // (N, k): the chosen experts, best first
  float* weight;      // (N, k): their combine weights
  int32_t* row;       // (N, k): the sorted row of token t's j-th choice (-1: dropped)
  int32_t* source;    // (N k): the token each sorted row reads (the first rows() used)
  float* row_weight;  // (N k): each sorted row's combine weight
  int32_t* chosen;    // (E + 1): RouteCounts::chosen (router_backward reads the loads)
};

// What the host learns of a routing: the experts' rows and the auxiliary losses.
struct RouteCounts {
  int tokens = 0, k = 0, experts = 0;
  std::vector<int32_t> offset;     // (E + 1): expert e's sorted rows are [offset[e], offset[e + 1])
  std::vector<int32_t> chosen;     // (E + 1): the offsets before any drop (what the router chose)
  int dropped = 0;                 // choices dropped over capacity (their rows are gone)
  double load_balance = 0, z = 0;  // the two auxiliary losses, before their coefficients
  int count(int e) const { return offset[static_cast<size_t>(e) + 1] - offset[static_cast<size_t>(e)]; }
  // Expert e's choices by the router, dropped ones included: the load the losses, the
  // selection bias and the metrics see.
  int load(int e) const { return chosen[static_cast<size_t>(e) + 1] - chosen[static_cast<size_t>(e)]; }
  double max_over_mean_load() const;  // the busiest expert's load over the mean
  int rows() const { return offset.back(); }
};

// A routing with its arrays on the host (tests, benchmarks, the CPU backend).
struct Routing : RouteCounts {
  std::vector<float> scores, weight, row_weight;
  std::vector<int32_t> expert, row, source;
  RoutedArrays arrays() {
    return {scores.data(), expert.data(), weight.data(), row.data(), source.data(), row_weight.data(), chosen.data()};
  }
};

// The most rows an expert takes of a microbatch of N tokens: ceil(capacity_factor N k / E).
int expert_capacity(double capacity_factor, int N, int k, int E);
// The most rows an expert keeps of a microbatch of N tokens under `spec`: expert_capacity,
// or INT_MAX without a capacity factor.
int kept_rows_limit(const RouterSpec& spec, int N);

// logits (N, E) row-major; bias (E) or null: added to the scores to choose, never to weigh.
// route_into writes the arrays of `out` (host memory); route_tokens allocates them.
RouteCounts route_into(const RoutedArrays& out, const float* logits, const float* bias, int N, const RouterSpec& spec);
Routing route_tokens(const float* logits, const float* bias, int N, const RouterSpec& spec);

// dlogits (N, E) of: the combine weights' gradient dweight (N, k), plus `scale` times the
// coefficients' sum of the auxiliary losses (scale: d(objective)/d(this microbatch's loss)),
// from the routing's scores (N, E), experts (N, k) and chosen offsets (E + 1), host memory.
void router_backward(const float* scores, const int32_t* expert, const int32_t* chosen, const float* logits,
                     const float* dweight, int N, const RouterSpec& spec, double scale, float* dlogits);
inline void router_backward(const Routing& r, const float* logits, const float* dweight, const RouterSpec& spec,
                            double scale, float* dlogits) {
  router_backward(r.scores.data(), r.expert.data(), r.chosen.data(), logits, dweight, r.tokens, spec, scale, dlogits);
}

// bias[e] += rate · sign(mean load − loads[e]) for each of the `experts`.
void update_selection_bias(float* bias, const double* loads, int experts, double rate);

}  // namespace pipetrain
