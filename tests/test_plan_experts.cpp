// The planner on mixtures of experts: the cost model's per-rank count against the layer's
// declarations (ep and tp shares, bf16's widened copies), ZeRO-1's share of the experts' moments,
// and ep's enumeration, all-to-all pricing and F&B-pair hiding.
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "pipetrain/plan/planner.hpp"
#include "plan_fixtures.hpp"
#include "test_files.hpp"

namespace pipetrain {
namespace {

using namespace testing;

// A mixture of experts' MLP half and its block: what the cost model counts is what the layer
// declares on one of tp ranks, bf16's widened copies included (the experts' matrices keep
// theirs even where products are native bf16: Parameter::f32_products).
TEST(ExpertCostModel, ParametersMatchTheDeclarations) {
  ModelConfig m = tiny_gpt2();
  m.arch = "llama", m.n_kv_head = 2, m.tie_embeddings = false;
  m.n_experts = 4, m.top_k = 2, m.expert_ffn_hidden = 32, m.n_shared_experts = 1;
  for (int tp : {1, 2})
    for (const auto& [unit, count, kind] : {std::tuple{2, 1, UnitKind::Mlp}, std::tuple{1, 2, UnitKind::Block}}) {
      const UnitParams want = declared(m, unit, count, tp), got = unit_params(m, kind, 0);
      EXPECT_DOUBLE_EQ(got.on_rank(tp), want.on_rank(tp)) << "unit " << unit << " tp " << tp;
      if (tp == 2) {
        EXPECT_DOUBLE_EQ(got.replicated, want.replicated) << "unit " << unit;
      }
      ParameterStore one;
      ModelStage a(m, unit, unit + count, one, TensorParallel{0, tp});
      double widened = 0;
      for (const auto& p : one.params())
        if (ParameterStore::needs_widened_copy(p, true)) widened += static_cast<double>(p.numel());
      EXPECT_DOUBLE_EQ(widened_params(m, kind, tp, true, 0), widened) << "unit " << unit << " tp " << tp;
    }
}

// ZeRO-1's moments: those of the parameters every ep rank holds alike over dp, the experts'
// over the dp / ep ranks that hold them.
TEST(ExpertCostModel, ZeroOneSplitsTheExpertsMomentsOverTheirHolders) {
  MemoryInputs in;
  in.params = 1000, in.experts = 600, in.dp = 4, in.ep = 2, in.zero1 = true;
  EXPECT_DOUBLE_EQ(rank_memory(in).optimizer, 8.0 * (400.0 / 4 + 600.0 / 2));
  in.ep = 4;  // each rank the only holder of its experts
  EXPECT_DOUBLE_EQ(rank_memory(in).optimizer, 8.0 * (400.0 / 4 + 600.0));
  in.zero1 = false;
  EXPECT_DOUBLE_EQ(rank_memory(in).optimizer, 8.0 * 1000);
}

// A mixture of experts on 4 CPU ranks: the planner tries ep 1, 2 and 4 on dp 4, each rank
// holding 1/ep of the experts' parameters and their state; it prices one
// microbatch's exchanges per MoE layer in F and in I, and an F&B pair hides them behind its
// partner's compute.
TEST(ExpertPlanner, EnumeratedPricedAndHiddenInPairs) {
  Config cfg = tiny_config(8);
  cfg.model.arch = "llama", cfg.model.n_kv_head = 2, cfg.model.tie_embeddings = false;
  cfg.model.n_experts = 8, cfg.model.top_k = 2, cfg.model.expert_ffn_hidden = 256;
  ClusterSpec c = node_of(4);
  c.device.kind = "cpu";
  auto predicted = [&](int dp, int pp, int ep, const std::string& sched, int v, int m) {
    Layout l;
    l.dp = dp, l.pp = pp, l.ep = ep, l.schedule = sched, l.virtual_stages = v;
    l.microbatches = m, l.microbatch_size = 8 / dp / m;
    return predict(cfg, c, l);
  };
  const Prediction whole = predicted(4, 1, 1, "1f1b", 1, 2), split = predicted(4, 1, 4, "1f1b", 1, 2);
  const double experts = 4 * 3.0 * 64 * 256 * 8;
  // Weights, gradients and moments of the 3/4 not held (16 bytes each), and MPI's scratch
  // for the experts' gradients: reduced over dp 4 whole (4 bytes each), over a group of one split.
  EXPECT_NEAR(whole.memory.total() - split.memory.total(), 16 * experts * 3 / 4 + 4 * experts, 1.0);
  EXPECT_EQ(whole.ep_comm_s, 0);
  const double exchange = expert_exchange_seconds(c, cfg.model, 1, 4, 1, 32);
  EXPECT_GT(exchange, 0);
  EXPECT_NEAR(split.ep_comm_s, 2 * 4 * 2 * exchange, 1e-12);  // F and I, 4 MoE layers, 2 microbatches
  EXPECT_NEAR(split.compute_s + split.tp_comm_s + split.ep_comm_s + split.bubble_s + split.dp_s + split.optimizer_s +
                  split.other_s,
              split.step_s, 1e-12);
  // The plan: dp 4 alone, m 1 or 2, ep 1, 2 or 4; where the experts do not fit whole, split.
  PlanOptions o;
  o.top = 100, o.only_tp = {1}, o.only_pp = {1}, o.precisions = {"fp32"}, o.recompute = {"none"}, o.zero1 = {false};
  EXPECT_EQ(plan(cfg, c, o).candidates, 6);
  c.device.memory_bytes = whole.memory.total() - 1;
  for (const auto& [l, p] : plan(cfg, c, o).ranked) EXPECT_GT(l.ep, 1) << describe(l);
  o.only_ep = {2};  // --ep 2
  for (const auto& [l, p] : plan(cfg, c, o).ranked) EXPECT_EQ(l.ep, 2) << describe(l);
  o.only_ep = {3};
  expect_one_line_error([&] { plan(cfg, c, o); }, {"has ep in [3]: ep must divide dp and model.n_experts (8)"});
  o.only_ep.clear();
  // ZeRO-1 beside every ep, and where it may be on, the unit levels: "gradients", and
  // "weights" in its three windows (the experts sharded over the dp / ep ranks holding them).
  o.zero1 = {false, true};
  EXPECT_EQ(plan(cfg, c, o).candidates, 6 * 6);
  o.zero1 = {false};
  // dualpipev's pairs on dp 2 x pp 2 with ep 2 hide part of the exchanges; in order, none.
  c.device.memory_bytes = 16 * 1073741824.0;
  const Prediction paired = predicted(2, 2, 2, "dualpipev", 2, 4);
  cfg.schedule.overlap = false;
  const Prediction in_order = predicted(2, 2, 2, "dualpipev", 2, 4);
  EXPECT_GT(in_order.ep_comm_s, 0);
  EXPECT_LT(paired.ep_comm_s, in_order.ep_comm_s);
  // Their weight gradients, queued past the B, keep one more microbatch's stash.
  EXPECT_GT(paired.memory.activations, in_order.memory.activations);
  // On GPUs ep is enumerated alike, and pairs run in order (the pipeline over NCCL, the
  // default with one rank per GPU): they hide nothing.
  c.device.kind = "cuda";
  EXPECT_EQ(plan(cfg, c, o).candidates, 6);
  const Prediction gpu_in_order = predicted(2, 2, 2, "dualpipev", 2, 4);
  cfg.schedule.overlap = true;
  EXPECT_NEAR(predicted(2, 2, 2, "dualpipev", 2, 4).ep_comm_s, gpu_in_order.ep_comm_s, 1e-15);
  EXPECT_GT(gpu_in_order.ep_comm_s, 0);
}

}  // namespace
}  // namespace pipetrain
