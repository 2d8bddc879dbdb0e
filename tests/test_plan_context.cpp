// The planner on context parallelism: the ring's price by hand (the attention a rank does
// over the whole causal window, the transfers its blocks hide or not), and cp's enumeration
// for long sequences of dense models: a cp-th of the stash per rank, the ring's exposed time in
// the step's breakdown, the layout's overrides, --cp and its one-line error.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include "pipetrain/plan/planner.hpp"
#include "plan_fixtures.hpp"
#include "test_files.hpp"

namespace pipetrain {
namespace {

using namespace testing;

Config long_config(int seq_len, int global_batch) {
  Config cfg = tiny_config(global_batch);
  cfg.train.seq_len = cfg.model.max_seq_len = seq_len;
  return cfg;
}

TEST(ContextCostModel, RingByHand) {
  const ModelConfig m = long_config(2048, 1).model;  // d_model 64: 4 heads of 16, as many key/value heads
  const int B = 1, context = 2048, rows = context / 2;
  // A rank's queries attend over the whole window: 2 N context C, and the ring's backward
  // recomputes the scores (2.5 times that, not 2).
  const UnitWork w = unit_work(m, UnitKind::Attention, 1, B, rows, 4, -1, context);
  const double attn = 2.0 * B * rows * context * 64;
  EXPECT_DOUBLE_EQ(w.attention_flops, attn);
  EXPECT_DOUBLE_EQ(w.i_flops - w.w_flops, 2.5 * attn);
  EXPECT_DOUBLE_EQ(unit_work(m, UnitKind::Attention, 1, B, context, 4, -1, context).i_flops -
                       unit_work(m, UnitKind::Attention, 1, B, context).w_flops,
                   2.0 * 2.0 * B * context * context * 64);  // the whole window on one rank: no ring

  ClusterSpec c = node_of(4);
  EXPECT_DOUBLE_EQ(ring_seconds(c, m, 1, 1, B, context, "fp32").I, 0.0);
  // One step moves a rank's keys and values: 2 x 1 024 rows x 64 floats.
  const double step = c.intra_node.latency + 4.0 * 2 * rows * 64 / c.intra_node.bandwidth;
  const double block_f = attn / 2 / (10e12 * 0.5);  // half the rank's attention, at fp32's peak x efficiency
  ASSERT_GT(block_f, 2 * step);                     // the fast link: hidden but for the gradients' last hop
  ActionTimes r = ring_seconds(c, m, 1, 2, B, context, "fp32");
  EXPECT_DOUBLE_EQ(r.F, 0.0);
  EXPECT_DOUBLE_EQ(r.I, step);
  c.intra_node.bandwidth = 1e8;  // 0.1 GB/s: every step's transfer outlasts its block
  const double slow = c.intra_node.latency + 4.0 * 2 * rows * 64 / c.intra_node.bandwidth;
  r = ring_seconds(c, m, 1, 2, B, context, "fp32");
  EXPECT_DOUBLE_EQ(r.F, slow - block_f);
  EXPECT_DOUBLE_EQ(r.I, 2 * slow - 2.5 * block_f + slow);
  // Over 4 ranks spaced 2 apart (tp 2): 8 ranks leave the node of 4 for the slower link.
  c = node_of(8);
  c.devices_per_node = 4;
  EXPECT_GT(ring_seconds(c, m, 2, 4, B, context, "fp32").I, ring_seconds(node_of(8), m, 2, 4, B, context, "fp32").I);
}

TEST(ContextPlanner, EnumeratedForLongSequencesWithACpthOfTheStash) {
  // 4 devices, batch 2, no tp or pp: dp 4 cannot split the batch, so dp 2 x cp 2 and cp 4.
  Config cfg = long_config(16384, 2);
  PlanOptions o;
  o.top = 100, o.only_tp = {1}, o.only_pp = {1}, o.precisions = {"fp32"}, o.recompute = {"none"}, o.zero1 = {false};
  const PlanResult r = plan(cfg, node_of(4), o);
  std::set<int> cps;
  for (const auto& [l, p] : r.ranked) {
    cps.insert(l.cp);
    EXPECT_EQ(l.dp * l.cp, 4) << describe(l);
    // The ring's exposed transfers: each of 4 blocks, each microbatch, forward and backward.
    const ActionTimes ring = ring_seconds(node_of(4), cfg.model, 1, l.cp, l.microbatch_size, 16384, "fp32");
    EXPECT_NEAR(p.cp_comm_s, l.microbatches * 4 * (ring.F + ring.I), 1e-12) << describe(l);
    EXPECT_NEAR(p.compute_s + p.tp_comm_s + p.cp_comm_s + p.bubble_s + p.dp_s + p.optimizer_s + p.other_s, p.step_s,
                1e-12);
    EXPECT_NE(describe(l).find(fmt::format("cp {} x", l.cp)), std::string::npos) << describe(l);
    const auto o2 = layout_overrides(l);
    EXPECT_NE(std::find(o2.begin(), o2.end(), fmt::format("parallel.cp={}", l.cp)), o2.end());
  }
  EXPECT_EQ(cps, (std::set<int>{2, 4}));
  // A rank's stash holds its tokens only: cp 4 holds about half of cp 2's activations.
  Layout two, four;
  two.dp = 2, two.cp = 2, four.cp = 4;
  const Prediction p2 = predict(cfg, node_of(4), two), p4 = predict(cfg, node_of(4), four);
  EXPECT_NEAR(p4.memory.activations / p2.memory.activations, 0.5, 0.05);
  // Sequences of 4 096: a rank would keep 2 048 tokens or fewer (kMinRingChunk); no ring.
  cfg = long_config(4096, 4);
  for (const auto& [l, p] : plan(cfg, node_of(4), o).ranked) EXPECT_EQ(l.cp, 1) << describe(l);
  cfg = long_config(16384, 2);
  o.only_cp = {4};  // --cp 4
  for (const auto& [l, p] : plan(cfg, node_of(4), o).ranked) EXPECT_EQ(l.cp, 4) << describe(l);
  o.only_cp = {3};
  expect_one_line_error([&] { plan(cfg, node_of(4), o); }, {"has cp in [3]", "train.seq_len (16384)"});
  // A mixture of experts has no ring yet.
  cfg.model.arch = "llama", cfg.model.n_kv_head = 2, cfg.model.tie_embeddings = false;
  cfg.model.n_experts = 4, cfg.model.top_k = 2, cfg.model.expert_ffn_hidden = 64;
  o.only_cp = {2};
  expect_one_line_error([&] { plan(cfg, node_of(4), o); }, {"has cp in [2]", "no experts"});
}

}  // namespace
}  // namespace pipetrain
