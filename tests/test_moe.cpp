// Mixture of experts: the routing (ties, order, weights), the router's backward against
// finite differences, and the MoE layer against a double reference written here from the
// formulas (moe_mlp.hpp) and against finite differences of its forward plus its
// auxiliary losses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "model_fixtures.hpp"
#include "moe_reference.hpp"
#include "pipetrain/backend/moe_routing.hpp"
#include "pipetrain/core/config.hpp"
#include "pipetrain/model/moe_mlp.hpp"
#include "pipetrain/model/moe_stats.hpp"
#include "pipetrain/model/stage.hpp"
#include "pipetrain/plan/cost_model.hpp"

namespace pipetrain {
namespace {

using testing::dot;
using testing::random_tensor;

std::vector<float> random_vector(size_t n, uint64_t seed, double scale) {
  std::vector<float> v(n);
  Rng rng(seed);
  for (float& x : v) x = static_cast<float>(rng.normal() * scale);
  return v;
}

TEST(MoeRouting, TiesGoToTheLowerExpertAndRowsAreSortedByExpertThenToken) {
  const RouterSpec spec{4, 2, RouterKind::Softmax, true, 0, 0};
  // Token 0: all equal -> experts 0, 1. Token 1: 3 best, then 1 and 2 tied -> 3, 1.
  const std::vector<float> logits{0, 0, 0, 0, 0, 1, 1, 2};
  const Routing r = route_tokens(logits.data(), nullptr, 2, spec);
  EXPECT_EQ(r.expert, (std::vector<int32_t>{0, 1, 3, 1}));
  EXPECT_EQ(r.offset, (std::vector<int32_t>{0, 1, 3, 3, 4}));
  EXPECT_EQ(r.source, (std::vector<int32_t>{0, 0, 1, 1}));  // expert 1: token 0, then token 1
  EXPECT_EQ(r.row, (std::vector<int32_t>{0, 1, 3, 2}));
  EXPECT_FLOAT_EQ(r.weight[0] + r.weight[1], 1.0f);  // renormalised
  EXPECT_FLOAT_EQ(r.weight[0], 0.5f);
  EXPECT_DOUBLE_EQ(r.max_over_mean_load(), 2.0);  // expert 1 took 2 of 4 rows, the mean is 1
  // A selection bias changes the choice, not the weights' source.
  const std::vector<float> bias{0, 0, 5, 0};
  const Routing b = route_tokens(logits.data(), bias.data(), 2, spec);
  EXPECT_EQ(b.expert[0], 2);
  EXPECT_EQ(b.expert[2], 2);
  EXPECT_NEAR(b.weight[2] / b.weight[3], std::exp(1.0 - 2.0), 1e-6);  // scores p2 / p3, no bias
}

// route_tokens against the routing written from its definition (moe_reference.hpp), on
// random logits spread so that no two scores are near a tie: softmax and sigmoid, renormalised
// or not, a selection bias, a capacity that drops choices. The same choices, kept rows and
// loads; weights and losses within float rounding of the double reference (scores rounded
// once to float, relative 2^-24, then sums of at most E terms: 1e-6 with room).
TEST(MoeRouting, MatchesTheRoutingWrittenFromItsDefinition) {
  const int N = 60, E = 8;
  const std::vector<float> logits = random_vector(static_cast<size_t>(N) * E, 41, 2.0);
  const std::vector<float> bias = random_vector(E, 42, 0.05);
  const RouterSpec specs[] = {{E, 2, RouterKind::Softmax, true, 0.01, 0.001},
                              {E, 3, RouterKind::Sigmoid, false, 0.01, 0.001},
                              {E, 1, RouterKind::Softmax, false, 0.01, 0.001, 0.5},
                              {E, 4, RouterKind::Sigmoid, true, 0.01, 0.001, 1.0}};
  for (const RouterSpec& spec : specs)
    for (bool with_bias : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "top " << spec.top_k << (spec.kind == RouterKind::Sigmoid ? " sigmoid" : " softmax")
                                        << ", capacity " << spec.capacity_factor << (with_bias ? ", bias" : ""));
      const std::vector<float> b = with_bias ? bias : std::vector<float>{};
      const Routing got = route_tokens(logits.data(), with_bias ? b.data() : nullptr, N, spec);
      const testing::ReferenceRouting want = testing::reference_routing(logits, b, N, spec);
      for (size_t tj = 0; tj < want.expert.size(); ++tj) {
        ASSERT_EQ(got.expert[tj], want.expert[tj]) << "choice " << tj;
        EXPECT_EQ(got.row[tj] >= 0, bool(want.kept[tj])) << "choice " << tj;
        EXPECT_NEAR(got.weight[tj], want.weight[tj], 1e-6) << "choice " << tj;
      }
      for (int e = 0; e < E; ++e) EXPECT_EQ(got.load(e), want.load[static_cast<size_t>(e)]) << "expert " << e;
      EXPECT_NEAR(got.load_balance, want.load_balance, 1e-6 * want.load_balance);
      EXPECT_NEAR(got.z, want.z, 1e-6 * want.z);
    }
}

// A diverged router (NaN or infinite logits) still chooses k distinct experts in range,
// NaN scores last: its rows never point outside the layout. The step fails later, by its
// non-finite loss, with the rank named.
TEST(MoeRouting, NonFiniteLogitsStillChooseDistinctExpertsInRange) {
  const float nan = std::nanf(""), inf = INFINITY;
  const RouterSpec spec{4, 3, RouterKind::Softmax, true, 0, 0};
  const std::vector<float> logits{nan, nan, nan, nan, 1, nan, 2, 0, inf, 0, 0, 0};
  const Routing r = route_tokens(logits.data(), nullptr, 3, spec);
  EXPECT_EQ(r.expert, (std::vector<int32_t>{0, 1, 2, 0, 1, 2, 0, 1, 2}));  // NaN scores everywhere: by index
  const Routing s = route_tokens(logits.data(), nullptr, 3, RouterSpec{4, 3, RouterKind::Sigmoid, true, 0, 0});
  EXPECT_EQ(std::vector<int32_t>(s.expert.begin() + 3, s.expert.begin() + 6), (std::vector<int32_t>{2, 0, 3}));
  EXPECT_EQ(s.rows(), 9);
}

// The router's backward: the objective sum_tj dw_tj w_tj + scale (a lb + b z) by central
// differences along a random direction of the logits (spread wide so no choice flips).
void check_router_backward(RouterKind kind, bool renormalize, bool force_balance = false) {
  const int N = 6, E = 5;
  const RouterSpec spec{E, 2, kind, renormalize, 0.3, 0.2, 0, force_balance};
  std::vector<float> logits = random_vector(static_cast<size_t>(N) * E, 3, 2.0);
  const std::vector<float> dw = random_vector(static_cast<size_t>(N) * 2, 4, 1.0);
  const std::vector<float> dir = random_vector(logits.size(), 5, 1.0);
  const double scale = 0.7;
  auto objective = [&](const std::vector<float>& l) {
    const Routing r = route_tokens(l.data(), nullptr, N, spec);
    double o = scale * (spec.aux_loss * r.load_balance + spec.z_loss * r.z);
    for (size_t i = 0; i < dw.size(); ++i) o += static_cast<double>(dw[i]) * r.weight[i];
    return std::pair{o, r.expert};
  };
  const Routing r = route_tokens(logits.data(), nullptr, N, spec);
  std::vector<float> dl(logits.size());
  router_backward(r, logits.data(), dw.data(), spec, scale, dl.data());
  const float eps = 1e-3f;
  std::vector<float> plus = logits, minus = logits;
  for (size_t i = 0; i < logits.size(); ++i) plus[i] += eps * dir[i], minus[i] -= eps * dir[i];
  const auto [op, ep] = objective(plus);
  const auto [om, em] = objective(minus);
  ASSERT_EQ(ep, r.expert);  // the same choices on both sides: the objective is smooth there
  ASSERT_EQ(em, r.expert);
  const double fd = (op - om) / (2.0 * eps), an = dot(dl.data(), dir.data(), static_cast<int64_t>(dl.size()));
  // f32 weights (relative 6e-8 each) over differences of 2e-3: about 1e-4 of the value.
  EXPECT_NEAR(an, fd, 2e-3 * std::abs(fd) + 2e-4)
      << "router " << (kind == RouterKind::Softmax ? "softmax" : "sigmoid") << (renormalize ? ", renormalised" : "")
      << (force_balance ? ", forced balance" : "");
}

// DeepSeek-V3's balancing: the bias moves each expert by the rate towards the mean load;
// applied step after step to a router that sends every token to expert 0 first, it
// spreads the load until the busiest expert is within 1.3 of the mean (tokens' preferences
// differ by up to 0.8: a bias can sort them).
TEST(MoeRouting, SelectionBiasMovesTowardsEqualLoad) {
  std::vector<float> bias(4, 0.0f);
  const std::vector<double> loads{3, 1, 2, 2};
  update_selection_bias(bias.data(), loads.data(), 4, 0.01);
  EXPECT_EQ(bias, (std::vector<float>{-0.01f, 0.01f, 0.0f, 0.0f}));

  const int N = 64, E = 4;
  const RouterSpec spec{E, 2, RouterKind::Sigmoid, true, 0, 0};
  std::vector<float> logits(static_cast<size_t>(N) * E);
  for (int t = 0; t < N; ++t)
    for (int e = 0; e < E; ++e)
      logits[static_cast<size_t>(t * E + e)] = 1.0f - 0.4f * e + 0.05f * ((t * 37 + e * 11) % 17);
  std::fill(bias.begin(), bias.end(), 0.0f);
  const double first = route_tokens(logits.data(), bias.data(), N, spec).max_over_mean_load();
  double load = first;
  for (int step = 0; step < 200; ++step) {
    const Routing r = route_tokens(logits.data(), bias.data(), N, spec);
    std::vector<double> rows(E);
    for (int e = 0; e < E; ++e) rows[static_cast<size_t>(e)] = r.count(e);
    update_selection_bias(bias.data(), rows.data(), E, 0.005);
    load = r.max_over_mean_load();
  }
  EXPECT_EQ(first, 2.0);  // experts 0 and 1 take every token
  EXPECT_LT(load, 1.3);
}

// A capacity keeps each expert's first rows in token order and drops the rest: their
// choices' rows become -1, the kept rows close up, the router's choices stay the load.
TEST(MoeRouting, CapacityDropsLaterTokensAndCountsThem) {
  const std::vector<float> logits{3, 0, 2, 0, 1, 0, 0, 5};            // tokens 0-2 prefer expert 0, token 3 expert 1
  const RouterSpec spec{2, 1, RouterKind::Softmax, true, 0, 0, 1.0};  // capacity ceil(1 · 4 · 1 / 2) = 2
  EXPECT_EQ(expert_capacity(1.0, 4, 1, 2), 2);
  const Routing r = route_tokens(logits.data(), nullptr, 4, spec);
  EXPECT_EQ(r.row, (std::vector<int32_t>{0, 1, -1, 2}));
  EXPECT_EQ(r.source, (std::vector<int32_t>{0, 1, 3}));
  EXPECT_EQ(r.dropped, 1);
  EXPECT_EQ(r.rows(), 3);
  EXPECT_EQ(r.count(0), 2);
  EXPECT_EQ(r.load(0), 3);
  EXPECT_DOUBLE_EQ(r.max_over_mean_load(), 3.0 / 2.0);
  const Routing free = route_tokens(logits.data(), nullptr, 4, RouterSpec{2, 1, RouterKind::Softmax, true, 0, 0, 0});
  EXPECT_EQ(free.dropped, 0);
  EXPECT_DOUBLE_EQ(free.load_balance, r.load_balance);  // the loss sees the router's choices
}

TEST(MoeRouting, BackwardMatchesFiniteDifferences) {
  for (RouterKind kind : {RouterKind::Softmax, RouterKind::Sigmoid})
    for (bool renormalize : {true, false}) check_router_backward(kind, renormalize);
  check_router_backward(RouterKind::Softmax, true, true);
}

// Benchmarks' forced balance: round robin over the experts whatever the scores, so every
// expert takes N k / E rows, each weighed by the router's (renormalised) scores of its
// experts; the losses see those choices.
TEST(MoeRouting, ForcedBalanceGivesEveryExpertTheSameRowsWeighedByTheScores) {
  const int N = 6, E = 4;
  const std::vector<float> logits = random_vector(static_cast<size_t>(N) * E, 7, 2.0);
  const RouterSpec spec{E, 2, RouterKind::Softmax, true, 0, 0, 0, true};
  const Routing r = route_tokens(logits.data(), nullptr, N, spec);
  EXPECT_EQ(r.expert, (std::vector<int32_t>{0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3}));
  for (int e = 0; e < E; ++e) EXPECT_EQ(r.load(e), 3) << "expert " << e;
  EXPECT_DOUBLE_EQ(r.max_over_mean_load(), 1.0);
  for (int t = 0; t < N; ++t) {
    const float* s = r.scores.data() + static_cast<size_t>(t) * E;
    const float a = s[r.expert[2 * t]], b = s[r.expert[2 * t + 1]];
    EXPECT_FLOAT_EQ(r.weight[2 * t], a / (a + b)) << "token " << t;
  }
}

ModelConfig tiny_moe(int shared) {
  ModelConfig m = testing::tiny_model();
  m.arch = "llama";
  m.n_head = 4;
  m.n_kv_head = 2;
  m.d_model = 16;
  m.n_experts = 4;
  m.top_k = 2;
  m.expert_ffn_hidden = 12;
  m.n_shared_experts = shared;
  m.aux_loss_coeff = 0.05;
  m.z_loss_coeff = 0.01;
  return m;
}

class MoeLayer : public ::testing::Test {
 protected:
  void SetUp() override {
    backend = make_cpu_backend();
    pool = MemoryPool::create(*backend);
    ctx.backend = backend.get();
    ctx.pool = pool.get();
    ctx.B = 2;
    ctx.T = 5;
  }
  // Parameters initialised, the norm's moved off 1, the router's spread so that no choice
  // is near a tie (finite differences stay on one side of every selection).
  void init(ParameterStore& store, const MoeMlp& layer) {
    store.allocate(*pool, *backend);
    store.initialize(5, *backend);
    for (auto& p : store.params()) {
      Rng rng = Rng::for_stream(9, p.name);
      const bool router = p.name.find("router") != std::string::npos;
      for (int64_t i = 0; i < p.numel(); ++i)
        p.value.f32()[i] =
            router ? static_cast<float>(rng.normal()) : p.value.f32()[i] + static_cast<float>(0.1 * rng.normal());
    }
    (void)layer;
    store.zero_grads(*backend);
  }
  std::unique_ptr<Backend> backend;
  std::shared_ptr<MemoryPool> pool;
  MicrobatchContext ctx;
};

// The layer's output, in double, from the formulas: every token through each of its
// experts, routed by moe_reference.hpp (no code shared with the router under test).
std::vector<double> reference(const ModelConfig& m, ParameterStore& store, const std::vector<float>& x, int N) {
  const int C = m.d_model, F = m.expert_ffn(), E = m.n_experts, S = m.n_shared_experts * F;
  auto w = [&](const std::string& leaf) { return store.find("h.0." + leaf)->value.f32(); };
  std::vector<double> n(static_cast<size_t>(N) * C), y(x.begin(), x.end());
  std::vector<float> logits(static_cast<size_t>(N) * E);
  for (int t = 0; t < N; ++t) {
    double ss = 0;
    for (int c = 0; c < C; ++c) ss += double(x[t * C + c]) * x[t * C + c];
    const double rstd = 1.0 / std::sqrt(ss / C + m.norm_eps);
    for (int c = 0; c < C; ++c) n[t * C + c] = x[t * C + c] * rstd * w("mlp_norm.w")[c];
    for (int e = 0; e < E; ++e) {
      double l = 0;
      for (int c = 0; c < C; ++c) l += n[t * C + c] * w("moe.router.w")[e * C + c];
      logits[t * E + e] = static_cast<float>(l);
    }
  }
  const RouterSpec spec{E, m.top_k, RouterKind::Softmax, m.router_renormalize, 0, 0, m.capacity_factor};
  const testing::ReferenceRouting r = testing::reference_routing(logits, {}, N, spec);
  // One SwiGLU expert: rows [0, width) of the gate and up tables at g, u; down (C, width) at d.
  auto expert = [&](int t, const float* g, const float* u, const float* d, int width, double weight) {
    for (int f = 0; f < width; ++f) {
      double gv = 0, uv = 0;
      for (int c = 0; c < C; ++c) gv += n[t * C + c] * g[f * C + c], uv += n[t * C + c] * u[f * C + c];
      const double a = gv / (1 + std::exp(-gv)) * uv;
      for (int c = 0; c < C; ++c) y[t * C + c] += weight * a * d[c * width + f];
    }
  };
  for (int t = 0; t < N; ++t) {
    for (int j = 0; j < m.top_k; ++j) {
      if (!r.kept[t * m.top_k + j]) continue;  // dropped over capacity
      const int e = r.expert[t * m.top_k + j];
      const size_t at = static_cast<size_t>(e) * F * C;
      expert(t, w("moe.gate.w") + at, w("moe.up.w") + at, w("moe.down.w") + at, F, r.weight[t * m.top_k + j]);
    }
    if (S > 0) expert(t, w("moe.shared_gate.w"), w("moe.shared_up.w"), w("moe.shared_down.w"), S, 1.0);
  }
  return y;
}

// tiny_moe with a capacity of ceil(0.5 · 10 tokens · 2 / 4 experts) = 3 rows per expert:
// at least 8 of the 20 choices are dropped.
ModelConfig tiny_moe_capped() {
  ModelConfig m = tiny_moe(1);
  m.capacity_factor = 0.5;
  return m;
}

TEST_F(MoeLayer, ForwardMatchesADoubleReference) {
  for (const ModelConfig& m : {tiny_moe(0), tiny_moe(1), tiny_moe_capped()}) {
    const int shared = m.n_shared_experts;
    ParameterStore store;
    MoeMlp layer(m, 0, store);
    init(store, layer);
    const int N = ctx.B * ctx.T;
    const Tensor x = random_tensor(*pool, {N, m.d_model}, 4);
    std::unique_ptr<Stash> stash;
    const Tensor y = layer.forward(ctx, x, stash);
    const std::vector<double> want = reference(m, store, std::vector<float>(x.f32(), x.f32() + x.numel()), N);
    // f32 sums of at most C + F + k F terms of magnitude <= 1: relative 2^-24 each, 1e-5 with room.
    for (int64_t i = 0; i < y.numel(); ++i)
      ASSERT_NEAR(y.f32()[i], want[static_cast<size_t>(i)], 1e-5 * (1 + std::abs(want[static_cast<size_t>(i)])))
          << "element " << i << ", shared experts " << shared << ", capacity factor " << m.capacity_factor;
    EXPECT_GT(layer.last_forward().max_over_mean_load, 1.0 - 1e-12);
  }
}

// Backward against central differences of L = sum(R y) + (a lb + b z) (loss_scale N = 1:
// the auxiliary losses' weight in the objective), along random directions.
TEST_F(MoeLayer, BackwardMatchesFiniteDifferences) {
  for (const ModelConfig& m : {tiny_moe(0), tiny_moe(2), tiny_moe_capped()}) {
    const int shared = m.n_shared_experts + (m.capacity_factor > 0 ? 10 : 0);  // in messages: 1x = capped
    ParameterStore store;
    MoeMlp layer(m, 0, store);
    init(store, layer);
    const int N = ctx.B * ctx.T;
    ctx.loss_scale = 1.0f / static_cast<float>(N);
    Tensor x = random_tensor(*pool, {N, m.d_model}, 4);
    const Tensor R = random_tensor(*pool, {N, m.d_model}, 3);
    auto probe = [&] {
      std::unique_ptr<Stash> st;
      const Tensor y = layer.forward(ctx, x, st);
      const MoeForwardStats& s = layer.last_forward();
      return dot(y.f32(), R.f32(), y.numel()) + m.aux_loss_coeff * s.load_balance + m.z_loss_coeff * s.z;
    };
    std::unique_ptr<Stash> stash;
    layer.forward(ctx, x, stash);
    const Tensor dx = layer.backward(ctx, R, *stash);
    stash.reset();
    const float eps = 1e-3f;
    auto directional = [&](float* data, int64_t n, const float* grad, uint64_t seed) {
      std::vector<float> dir = random_vector(static_cast<size_t>(n), seed, 1.0), saved(data, data + n);
      auto shifted = [&](float s) {
        for (int64_t i = 0; i < n; ++i) data[i] = saved[static_cast<size_t>(i)] + s * dir[static_cast<size_t>(i)];
        return probe();
      };
      const double fd = (shifted(eps) - shifted(-eps)) / (2.0 * eps);
      std::copy(saved.begin(), saved.end(), data);
      return std::pair{fd, dot(grad, dir.data(), n)};
    };
    // f32 forward (relative 1e-6 over ~10 units) over 2e-3 differences: 5e-3 of the value.
    auto [fd, an] = directional(x.f32(), x.numel(), dx.f32(), 21);
    EXPECT_NEAR(an, fd, 1e-2 * std::abs(fd) + 1e-3) << "input gradient, shared " << shared;
    for (auto& p : store.params()) {
      auto [pfd, pan] = directional(p.value.f32(), p.numel(), p.grad.f32(), stable_hash(p.name));
      EXPECT_NEAR(pan, pfd, 1e-2 * std::abs(pfd) + 1e-3) << "gradient of " << p.name << ", shared " << shared;
    }
  }
}

// A step's statistics: rows summed per MoE block over microbatches, the losses averaged
// over blocks and microbatches, the busiest expert over the mean per MoE block.
TEST(MoeModel, StepStatisticsSumMicrobatchesAndAverageTheLosses) {
  ModelConfig m = tiny_moe(0);
  m.n_layer = 3;
  m.first_dense = 1;  // blocks 1 and 2
  const RouterSpec spec{4, 2, RouterKind::Softmax, true, 0, 0};
  const std::vector<float> all_first{3, 2, 0, 0, 3, 2, 0, 0}, spread{3, 2, 0, 0, 0, 0, 3, 2};
  const Routing a = route_tokens(all_first.data(), nullptr, 2, spec), b = route_tokens(spread.data(), nullptr, 2, spec);
  MoeStepStats s(m);
  s.add(1, a);  // experts 0 and 1 take both tokens: rows 2, 2, 0, 0
  s.add(1, b);  // then 1, 1, 1, 1
  s.add(2, b);
  const std::vector<double> load = s.max_over_mean_load();
  ASSERT_EQ(load.size(), 2u);
  EXPECT_DOUBLE_EQ(load[0], 3.0 / (8.0 / 4));
  EXPECT_DOUBLE_EQ(load[1], 1.0);
  EXPECT_DOUBLE_EQ(s.load_balance(), (a.load_balance + 2 * b.load_balance) / 3);
  EXPECT_DOUBLE_EQ(s.z(), (a.z + 2 * b.z) / 3);
  s.clear();
  EXPECT_EQ(s.load_balance(), 0.0);
}

// The cost model's parameter count (the planner's and the run header's memory estimate's)
// is what the model declares, experts included (on a rank: its ep and tp share); a token's
// FLOPs count only its experts.
TEST(MoeModel, CostModelCountsEveryExpertAndFlopsOnlyTheActiveOnes) {
  ModelConfig m = tiny_moe(1);
  m.n_layer = 4;
  m.first_dense = 1;
  m.moe_every = 2;  // blocks 1 and 3
  EXPECT_EQ(m.moe_blocks(), 2);
  ParameterStore store;
  ModelStage whole(m, 0, model_num_units(m), store);
  double declared = 0;
  for (const auto& p : store.params()) declared += static_cast<double>(p.numel());
  EXPECT_DOUBLE_EQ(model_params(m), declared);
  const double C = m.d_model, idle = 2 * 3.0 * C * m.expert_ffn() * (m.n_experts - m.top_k), T = 8;
  EXPECT_DOUBLE_EQ(model_flops_per_token(m, static_cast<int64_t>(declared), static_cast<int>(T)),
                   6.0 * (declared - m.padded_vocab() * C - idle) + 6.0 * m.n_layer * C * T);
  // Under ep = 2 a rank holds half of each routed expert matrix: what the layer declares there.
  ParameterStore half;
  MoeMlp layer(m, 1, half, ExpertParallel{1, 2});
  double on_rank = 0;
  for (const auto& p : half.params()) on_rank += static_cast<double>(p.numel());
  EXPECT_DOUBLE_EQ(unit_params(m, UnitKind::Mlp, 1).on_rank(1, 2), on_rank);
  // Under ep = 2 and tp = 2 as well: a quarter of each routed expert matrix, half the shared.
  ParameterStore quarter;
  MoeMlp split(m, 1, quarter, ExpertParallel{1, 2}, TensorParallel{1, 2});
  on_rank = 0;
  for (const auto& p : quarter.params()) on_rank += static_cast<double>(p.numel());
  EXPECT_DOUBLE_EQ(unit_params(m, UnitKind::Mlp, 1).on_rank(2, 2), on_rank);
}

}  // namespace
}  // namespace pipetrain
