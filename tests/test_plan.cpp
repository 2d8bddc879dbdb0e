// The planner: cluster files (every key checked), enumeration, packing and the slices as
// priced, memory pruning, the branch-and-bound ranking against an exhaustive one, and the
// errors. The cost model's pieces by hand: test_cost_model.cpp.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "pipetrain/model/parameters.hpp"
#include "pipetrain/model/stage.hpp"
#include "pipetrain/plan/cluster.hpp"
#include "pipetrain/plan/cost_model.hpp"
#include "pipetrain/plan/planner.hpp"
#include "pipetrain/plan/product_choice.hpp"
#include "pipetrain/plan/vocab_choice.hpp"
#include "pipetrain/schedule/registry.hpp"
#include "plan_fixtures.hpp"
#include "test_files.hpp"

namespace pipetrain {
namespace {

using namespace testing;

TEST(ClusterFile, ShippedExamplesLoad) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(std::string(PIPETRAIN_SOURCE_DIR) + "/inputs/clusters")) {
    const ClusterSpec c = load_cluster(e.path().string());
    EXPECT_GT(c.devices(), 0) << e.path();
    EXPECT_FALSE(c.device.peak_flops.empty()) << e.path();
    EXPECT_GT(c.device.memory_bytes, c.device.reserve_bytes) << e.path();
    ++n;
  }
  EXPECT_GE(n, 3);  // a CPU node, 8 x H100, 8 x A100
}

TEST(ClusterFile, RoundTripsThroughToml) {
  ClusterSpec c = parse_cluster(kCluster, "a.toml");
  c.intra_node.allreduce_bandwidth = 80e9;
  c.device.measured["fp32"] = UnitRates{{128, 512}, {50e9, 80e9}, {60e9, 90e9}, 20e9, {}, {}};
  const ClusterSpec d = parse_cluster(cluster_to_toml(c), "b.toml");
  EXPECT_EQ(d.nodes, 2);
  EXPECT_EQ(d.devices_per_node, 4);
  EXPECT_EQ(d.device.kind, "cuda");
  EXPECT_NEAR(d.device.memory_bytes, c.device.memory_bytes, 1e3);
  EXPECT_NEAR(d.device.peak_flops.at("bf16"), 100e12, 1e6);
  EXPECT_NEAR(d.intra_node.ring_bandwidth(), 80e9, 1e3);
  EXPECT_NEAR(d.inter_node.ring_bandwidth(), 10e9, 1e3);  // none given: the link's own
  EXPECT_NEAR(d.inter_node.latency, 5e-6, 1e-12);
  ASSERT_EQ(d.device.measured.at("fp32").tokens.size(), 2u);
  EXPECT_NEAR(d.device.measured.at("fp32").head_flops[1], 90e9, 1e3);
  EXPECT_FALSE(d.device.measured.at("fp32").has_packed());
  // The packed rates and the reorders, where calibration measured them.
  UnitRates& r = c.device.measured["fp32"];
  r.block_flops_packed = {70e9, 95e9}, r.head_flops_packed = {75e9, 99e9};
  r.block_reorder_s = 2.5e-3, r.head_reorder_s = 0.02;
  const UnitRates e = parse_cluster(cluster_to_toml(c), "c.toml").device.measured.at("fp32");
  ASSERT_TRUE(e.has_packed());
  EXPECT_NEAR(e.block_at(512, true), 95e9, 1e3);
  EXPECT_NEAR(e.block_at(512, false), 80e9, 1e3);
  EXPECT_NEAR(e.head_at(128, true), 75e9, 1e3);
  EXPECT_NEAR(e.block_reorder_s, 2.5e-3, 1e-12);
  EXPECT_NEAR(e.head_reorder_s, 0.02, 1e-12);
}

TEST(ClusterFile, EveryMissingKeyIsNamed) {
  for (const std::string key : {"nodes", "devices_per_node", "kind", "memory_gib", "reserve_gib", "gemm_efficiency",
                                "memory_bandwidth_gbs", "peak_tflops"}) {
    const std::string full = key == "nodes" || key == "devices_per_node" ? key : "device." + key;
    expect_one_line_error([&] { parse_cluster(without_line(kCluster, key + " ="), "c.toml"); }, {"c.toml", full});
  }
  // [inter_node]'s keys: drop its section's lines one at a time
  const std::string text = kCluster;
  const std::string tail = text.substr(text.find("[inter_node]"));
  const std::string head = text.substr(0, text.find("[inter_node]"));
  expect_one_line_error([&] { parse_cluster(head + without_line(tail, "bandwidth_gbs"), "c.toml"); },
                        {"c.toml", "inter_node.bandwidth_gbs"});
  expect_one_line_error([&] { parse_cluster(head, "c.toml"); }, {"c.toml", "[inter_node]"});
}

TEST(ClusterFile, BadValuesAndTyposAreErrors) {
  const std::string t = kCluster;
  auto with = [&](const std::string& from, const std::string& to) {
    std::string s = t;
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  expect_one_line_error([&] { parse_cluster(with("memory_gib", "memory_gb"), "c.toml"); },
                        {"c.toml", "device.memory_gib"});  // missing, and then the typo is unknown
  expect_one_line_error([&] { parse_cluster(t + "colour = 3\n", "c.toml"); }, {"c.toml", "unknown key", "colour"});
  expect_one_line_error([&] { parse_cluster(with("\"cuda\"", "\"tpu\""), "c.toml"); }, {"c.toml", "device.kind"});
  expect_one_line_error([&] { parse_cluster(with("reserve_gib = 1", "reserve_gib = 16"), "c.toml"); },
                        {"c.toml", "reserve_gib"});
  expect_one_line_error([&] { parse_cluster(with("gemm_efficiency = 0.5", "gemm_efficiency = 1.5"), "c.toml"); },
                        {"c.toml", "gemm_efficiency"});
  expect_one_line_error([&] { parse_cluster(with("nodes = 2", "nodes = 1.5"), "c.toml"); }, {"c.toml", "nodes"});
  expect_one_line_error([&] { parse_cluster(with("nodes = 2", "nodes = 44073709551"), "c.toml"); },
                        {"c.toml", "nodes", "too large"});  // past INT_MAX: no cast to int (found by fuzzing)
  expect_one_line_error([&] { parse_cluster(with("latency_us = 2", "latency_us = -2"), "c.toml"); },
                        {"c.toml", "intra_node.latency_us"});
  expect_one_line_error([&] { parse_cluster(with("fp32 = 10, bf16 = 100", ""), "c.toml"); },
                        {"c.toml", "peak_tflops"});
  expect_one_line_error([&] { parse_cluster(t + "[measured.fp32]\ntokens = [256, 128]\nblock_gflops = [1, 2]\n"
                                                "head_gflops = [1, 2]\nembedding_gbs = 1\n", "c.toml"); },
                        {"c.toml", "measured.fp32.tokens", "increase"});
  expect_one_line_error([&] { parse_cluster(t + "[measured.fp32]\ntokens = [128, 256]\nblock_gflops = [1]\n"
                                                "head_gflops = [1, 2]\nembedding_gbs = 1\n", "c.toml"); },
                        {"c.toml", "measured.fp32.block_gflops", "2 entries"});
  expect_one_line_error([] { load_cluster("/nonexistent/cluster.toml"); }, {"/nonexistent/cluster.toml"});
}

TEST(ClusterFile, MeasuredRatesInterpolateInLogTokens) {
  const UnitRates r{{100, 400}, {10, 30}, {1, 3}, 0, {}, {}};
  EXPECT_DOUBLE_EQ(r.block_at(50), 10);    // below: the first
  EXPECT_DOUBLE_EQ(r.block_at(1000), 30);  // above: the last
  EXPECT_NEAR(r.block_at(200), 20, 1e-12);  // log(200) is halfway between log(100) and log(400)
  EXPECT_NEAR(r.head_at(200), 2, 1e-12);
}

TEST(Planner, PeakStashesFollowTheSchedule) {
  EXPECT_EQ(peak_stashes(make_schedule("1f1b", {4, 1, 8})), (std::vector<int>{4, 3, 2, 1}));
  EXPECT_EQ(peak_stashes(make_schedule("gpipe", {4, 1, 8})), (std::vector<int>{8, 8, 8, 8}));
}

TEST(Planner, EnumeratesEveryGridScheduleAndMicrobatchCount) {
  // 2 devices, 4 layers, 4 heads, batch 2; 1f1b only, fp32, no recomputation:
  //   dp 2 (m = 1; ZeRO-1 off/on)         2
  //   pp 2 (m = 1, 2; 1f1b refuses v = 2) 2
  //   tp 2 (m = 1, 2)                     2
  Config cfg = tiny_config(2);
  PlanOptions o;
  o.top = 100, o.schedules = {"1f1b"}, o.precisions = {"fp32"}, o.recompute = {"none"};
  const PlanResult r = plan(cfg, node_of(2), o);
  EXPECT_EQ(r.candidates, 6);
  EXPECT_EQ(r.pruned_memory, 0);
  ASSERT_EQ(r.ranked.size(), 6u);
  std::set<std::string> seen;
  for (const auto& [l, p] : r.ranked) {
    EXPECT_EQ(l.dp * l.pp * l.tp, 2);
    EXPECT_EQ(l.dp * l.microbatches * l.microbatch_size, 2);
    EXPECT_GT(p.step_s, 0);
    EXPECT_NEAR(p.compute_s + p.tp_comm_s + p.bubble_s + p.dp_s + p.optimizer_s + p.other_s, p.step_s, 1e-12);
    seen.insert(describe(l));
  }
  EXPECT_EQ(seen.size(), 6u);
  o.schedules = {"interleaved-1f1b"};  // takes v = 2 at pp 2 (4 stages <= 4 layers) when m divides by pp
  EXPECT_EQ(plan(cfg, node_of(2), o).candidates, 2 + 1 + 1 + 2);  // dp; pp v1 m2, v2 m2; tp
  for (size_t k = 1; k < r.ranked.size(); ++k)
    EXPECT_LE(r.ranked[k - 1].second.step_s, r.ranked[k].second.step_s * (1 + 1e-3));
}

TEST(Planner, OneRankStepIsTheSumOfItsActions) {
  Config cfg = tiny_config(4);
  const ClusterSpec c = node_of(1);
  Layout l;
  l.microbatches = 2, l.microbatch_size = 2, l.precision = "bf16";
  const Prediction p = predict(cfg, c, l);
  const int B = 2, T = 32;
  auto sum = [&](UnitKind k) {
    const ActionTimes t = unit_times(c, cfg.model, k, 1, B, T, "bf16", Recompute::None);
    return t.F + t.I + t.W;
  };
  const double compute = 2 * (sum(UnitKind::Embedding) + 4 * sum(UnitKind::Block) + sum(UnitKind::Head));
  const double params = unit_params(cfg.model, UnitKind::Embedding).on_rank(1) +
                        4 * unit_params(cfg.model, UnitKind::Block).on_rank(1) +
                        unit_params(cfg.model, UnitKind::Head).replicated;
  EXPECT_NEAR(p.compute_s, compute, 1e-15);
  EXPECT_NEAR(p.bubble_s, 0, 1e-15);
  const double tail = adamw_seconds(params, c.device) + gradient_passes_seconds(params, c.device);
  EXPECT_NEAR(p.optimizer_s, tail, 1e-15);
  EXPECT_NEAR(p.step_s, compute + tail + p.other_s, 1e-15);
  EXPECT_EQ(l.blocks_per_stage, std::vector<double>{4});
}

TEST(Planner, PackedWeightsCountTwoCopiesOfTheMatrices) {
  Config cfg = tiny_config(4);
  const ClusterSpec c = node_of(1);
  Layout l;
  l.microbatches = 2, l.microbatch_size = 2, l.precision = "fp32";
  cfg.runtime.pack_weights = Toggle::Off;
  const double without = predict(cfg, c, l).memory.total();
  cfg.runtime.pack_weights = Toggle::On;
  const RankMemory m = predict(cfg, c, l).memory;
  const double dense = 4 * dense_weight_params(cfg.model, UnitKind::Block, 1) +
                       dense_weight_params(cfg.model, UnitKind::Head, 1);
  EXPECT_DOUBLE_EQ(m.packed_copies, 8 * dense);
  EXPECT_DOUBLE_EQ(m.total(), without + 8 * dense);
}

// "auto" in the planner decides per layout as the Trainer does: copies at microbatches of
// up to kPackRowsMax rows where they fit, none above or where they would not.
TEST(Planner, AutoPackingCountsCopiesWhereTheRunWouldPack) {
  Config cfg = tiny_config(8);
  cfg.model.d_model = kPackModelMin, cfg.model.n_head = 8;
  cfg.runtime.pack_weights = Toggle::Auto;
  cfg.train.seq_len = 128;
  const double dense = 4 * dense_weight_params(cfg.model, UnitKind::Block, 1) +
                       dense_weight_params(cfg.model, UnitKind::Head, 1);
  auto cpu = [](double gib) {
    ClusterSpec c = node_of(1, gib);
    c.device.kind = "cpu";
    return c;
  };
  Layout l;
  l.microbatches = 2, l.microbatch_size = kPackRowsMax / 128, l.precision = "fp32";
  EXPECT_DOUBLE_EQ(predict(cfg, cpu(16), l).memory.packed_copies, 8 * dense);
  EXPECT_DOUBLE_EQ(predict(cfg, node_of(1), l).memory.packed_copies, 0.0);  // a GPU multiplies in place
  const double tight = 8 * dense / 0.25 * 0.99 / 1073741824.0;  // GiB: the copies just over a quarter
  EXPECT_DOUBLE_EQ(predict(cfg, cpu(tight), l).memory.packed_copies, 0.0);
  l.microbatch_size *= 2, l.microbatches = 1;  // 1024 rows
  EXPECT_DOUBLE_EQ(predict(cfg, cpu(16), l).memory.packed_copies, 0.0);
}

// The choice from timed products: a library per product only past the 10% margin, the
// user's library over any timing, per-shape packing where m uses pay the reorders (the
// count and the slice's scale weighing the libraries, not the packing rule), nothing
// packed for inference, and no oneDNN where a shape has no oneDNN time.
TEST(ProductChoice, EachProductAndShapeByItsTimes) {
  auto use = [](DenseShape s, int count, double scale, std::array<double, 3> blas, std::array<double, 3> onednn,
                std::array<double, 2> packed, double reorder) {
    DenseShapeUse u;
    u.shape = s, u.count = count, u.scale = scale;
    u.times.shape = timed_shape(s);
    u.times.blas = blas, u.times.onednn = onednn, u.times.packed = packed, u.times.reorder = reorder;
    return u;
  };
  const std::vector<DenseShapeUse> shapes = {
      // forward: oneDNN 0.8 of the BLAS's time (past the margin); dx: 0.95 (within it); dW: slower.
      use({768, 768}, 12, 1, {1.0, 1.0, 1.0}, {0.8, 0.95, 1.2}, {0.5, 0.6}, 1.2),
      // packing saves (0.8 + 1.0) - (0.4 + 0.6) = 0.8 a use here against a reorder of 2: pays from 3 uses.
      use({50304, 768}, 1, 12.28, {1.0, 1.0, 1.0}, {0.8, 0.95, 1.2}, {0.4, 0.6}, 2.0),
  };
  const DenseChoice c = choose_dense_paths(shapes, std::nullopt, Toggle::Auto, 2);
  EXPECT_EQ(c.paths.library[kForward], ProductLibrary::Onednn);
  EXPECT_EQ(c.paths.library[kInputGradient], ProductLibrary::Blas);
  EXPECT_EQ(c.paths.library[kWeightGradient], ProductLibrary::Blas);
  // 768x768 saves (0.8 + 1.0) - (0.5 + 0.6) = 0.7 a use: 2 uses pay its 1.2, not the head's 2.
  EXPECT_EQ(c.paths.packed, (std::vector<DenseShape>{{768, 768}})) << c.why;
  EXPECT_NE(c.why.find("forward oneDNN (1.25x the BLAS's speed)"), std::string::npos) << c.why;
  EXPECT_EQ(choose_dense_paths(shapes, std::nullopt, Toggle::Auto, 3).paths.packed.size(), 2u);
  EXPECT_TRUE(choose_dense_paths(shapes, std::nullopt, Toggle::Auto, 0).paths.packed.empty());  // inference
  EXPECT_TRUE(choose_dense_paths(shapes, std::nullopt, Toggle::Off, 100).paths.packed.empty());
  const DenseChoice forced = choose_dense_paths(shapes, ProductLibrary::Onednn, Toggle::Off, 2);
  EXPECT_EQ(forced.paths.library, (std::array<ProductLibrary, 3>{ProductLibrary::Onednn, ProductLibrary::Onednn,
                                                                  ProductLibrary::Onednn}));
  std::vector<DenseShapeUse> no_onednn = shapes;
  no_onednn[1].times.onednn = {-1, -1, -1};
  EXPECT_EQ(choose_dense_paths(no_onednn, std::nullopt, Toggle::Off, 2).paths.library[kForward], ProductLibrary::Blas);
  // A saving within 5% of the plain products is noise: not packed, however many uses.
  std::vector<DenseShapeUse> marginal = {use({768, 768}, 1, 1, {1, 1, 1}, {2, 2, 2}, {0.97, 0.99}, 0)};
  EXPECT_TRUE(choose_dense_paths(marginal, std::nullopt, Toggle::Auto, 1000).paths.packed.empty());
}

// With a calibrated cluster file the planner packs a layout by the trainer's timed rule
// (plan/product_choice's packing_pays): where m microbatches' saving pays the reorders,
// and then prices the units at the packed rates and adds the reorders once a step.
TEST(Planner, CalibratedPackingPaysWhereTheMicrobatchesPayTheReorders) {
  Config cfg = tiny_config(8);
  cfg.model.d_model = kPackModelMin, cfg.model.n_head = 8;
  cfg.runtime.pack_weights = Toggle::Auto;
  cfg.train.seq_len = 128;
  ClusterSpec c = node_of(1, 64);
  c.device.kind = "cpu";
  c.device.peak_flops["fp32"] = 100e9;
  UnitRates& r = c.device.measured["fp32"];
  r = UnitRates{{1024}, {50e9}, {50e9}, 10e9, {100e9}, {100e9}};  // packed: twice the rate
  Layout l;
  l.microbatch_size = 8, l.precision = "fp32";  // 1024 tokens a microbatch
  const UnitWork w = unit_work(cfg.model, UnitKind::Block, 1, 8, 128);
  const double block = (w.f_flops + w.i_flops + w.w_flops) / 50e9;  // plain; packed saves half of it
  r.block_reorder_s = 3 * block / 2 * 0.99;                          // paid back by 3 microbatches, not 2
  r.head_reorder_s = 0;
  auto packed_copies = [&](int m) {
    l.microbatches = m;
    return predict(cfg, c, l).memory.packed_copies;
  };
  EXPECT_EQ(packed_copies(2), 0.0);
  EXPECT_GT(packed_copies(3), 0.0);
  EXPECT_TRUE(packing_pays(block / 2, block, r.block_reorder_s, 3));
  EXPECT_FALSE(packing_pays(block / 2, block, r.block_reorder_s, 2));
  // Priced as run: at m = 3 the blocks at the packed rate, plus their reorders once.
  l.microbatches = 3;
  const double packed_step = predict(cfg, c, l).compute_s;
  cfg.runtime.pack_weights = Toggle::Off;
  const double plain_step = predict(cfg, c, l).compute_s;
  const UnitWork hw = unit_work(cfg.model, UnitKind::Head, 1, 8, 128);
  const double head = (hw.f_flops + hw.i_flops + hw.w_flops) / 50e9;
  EXPECT_NEAR(plain_step - packed_step, 4 * (3 * block / 2 - r.block_reorder_s) + 3 * head / 2, 1e-9 * plain_step);
}

TEST(Planner, BranchAndBoundRanksAsTheExhaustiveSearch) {
  Config cfg = tiny_config(16);
  PlanOptions all;
  all.top = 100000;
  const PlanResult full = plan(cfg, node_of(4), all);
  EXPECT_EQ(full.simulated, full.candidates - full.pruned_memory);
  PlanOptions few;
  few.top = 3;
  const PlanResult some = plan(cfg, node_of(4), few);
  EXPECT_LT(some.simulated, full.simulated);
  ASSERT_EQ(some.ranked.size(), 3u);
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(describe(some.ranked[k].first), describe(full.ranked[k].first));
    EXPECT_DOUBLE_EQ(some.ranked[k].second.step_s, full.ranked[k].second.step_s);
  }
  EXPECT_FALSE(some.reason.empty());
}

// GPT-2 124M at seq 1024: the output layer is 6 V C = 231.8 MFLOP per token, a block
// 3 x 2 x 12 C^2 + 6 T C (causal attention) = 47.2 M: 4.9 blocks' work, (12 + 4.9) / stages a
// stage's share, so pp = 2 keeps whole layers and pp = 4, or pp = 2 with two stages per rank,
// slices the vocabulary.
TEST(VocabChoice, AutoSlicesWhereTheOutputLayerOutweighsAStagesShare) {
  Config cfg;
  cfg.model.n_layer = 12, cfg.model.n_head = 12, cfg.model.d_model = 768, cfg.model.vocab_size = 50257;
  cfg.model.max_seq_len = cfg.train.seq_len = 1024;
  cfg.train.global_batch = cfg.train.microbatches = 8;
  ASSERT_EQ(cfg.parallel.vocab_parallel, Toggle::Auto);  // the default
  auto choice = [&](int pp, int v = 1) {
    Config c = cfg;
    c.parallel.pp = pp, c.parallel.virtual_stages = v;
    return choose_vocab_parallel(c);
  };
  EXPECT_FALSE(choice(1).on);
  const VocabChoice two = choice(2), four = choice(4), looped = choice(2, 2);
  EXPECT_FALSE(two.on) << two.reason;
  EXPECT_NE(two.reason.find("auto: the output layer, 4.9 blocks' work, fits a stage's share (8.5 of 16.9 over 2"),
            std::string::npos)
      << two.reason;
  EXPECT_TRUE(four.on) << four.reason;
  EXPECT_NE(four.reason.find("more than a stage's share (4.2 of 16.9 over 4 stages)"), std::string::npos)
      << four.reason;
  EXPECT_TRUE(looped.on) << looped.reason;
  // What the run cannot take turns it off, saying why; true and false are obeyed.
  cfg.parallel.pp = 4;
  Config gpu = cfg, file = cfg, nccl = cfg, odd = cfg, forced = cfg, off = cfg;
  gpu.runtime.device = "cuda";
  file.schedule.file = "my.csv";
  nccl.comm.p2p = "nccl";
  odd.parallel.pp = 5;  // 5 slices do not divide 50304 rows
  for (const auto& [c, why] : {std::pair{gpu, "CPUs only"}, {file, "my.csv"}, {nccl, "nccl"}, {odd, "5 slices"}}) {
    const VocabChoice v = choose_vocab_parallel(c);
    EXPECT_FALSE(v.on);
    EXPECT_NE(v.reason.find(why), std::string::npos) << v.reason;
  }
  forced.parallel.vocab_parallel = Toggle::On, off.parallel.vocab_parallel = Toggle::Off;
  cfg.parallel.pp = 2;
  forced.parallel.pp = off.parallel.pp = 2;
  EXPECT_TRUE(choose_vocab_parallel(forced).on);
  off.parallel.pp = 8;
  EXPECT_FALSE(choose_vocab_parallel(off).on);
}

// A vocabulary ten blocks' work on four CPU ranks: the planner tries every layout with and
// without the slices, picks the slices, charges every rank its share of the output layer
// (its compute at least a quarter of one rank's: work is conserved) and holds less on the
// rank that held the head.
TEST(Planner, VocabularyParallelLayoutsArePricedAndChosenWhereTheyWin) {
  Config cfg = tiny_config(16);
  cfg.model.vocab_size = 8192;
  ClusterSpec c = node_of(4);
  c.device.kind = "cpu";
  PlanOptions o;
  o.precisions = {"fp32"}, o.only_pp = {4}, o.top = 3;
  const PlanResult with = plan(cfg, c, o);
  ASSERT_FALSE(with.ranked.empty());
  EXPECT_TRUE(with.ranked.front().first.vocab_parallel) << describe(with.ranked.front().first);
  EXPECT_NE(describe(with.ranked.front().first).find("vocabulary parallel"), std::string::npos);
  cfg.parallel.vocab_parallel = Toggle::Off;
  const PlanResult without = plan(cfg, c, o);
  EXPECT_EQ(with.candidates, 2 * without.candidates);
  EXPECT_LT(with.ranked.front().second.step_s, without.ranked.front().second.step_s);

  Layout one;
  one.microbatches = 4, one.microbatch_size = 4;
  const Prediction single = predict(cfg, c, one);
  Layout sliced = one;
  sliced.pp = 4, sliced.vocab_parallel = true;
  Layout whole = sliced;
  whole.vocab_parallel = false;
  const Prediction p = predict(cfg, c, sliced), q = predict(cfg, c, whole);
  EXPECT_GE(p.compute_s, single.compute_s / 4 * (1 - 1e-12));
  EXPECT_EQ(sliced.blocks_per_stage, (std::vector<double>{1, 1, 1, 1}));
  EXPECT_LT(p.memory.total(), q.memory.total());
  EXPECT_LT(p.step_s, q.step_s);
}

TEST(Planner, PrunesWhatDoesNotFitAndNamesTheSmallest) {
  Config cfg = tiny_config(8);
  cfg.model.vocab_size = 50000;  // the embedding dominates: more replicas of it need more memory
  PlanOptions o;
  o.top = 100000;
  const PlanResult all = plan(cfg, node_of(2), o);
  ASSERT_EQ(all.pruned_memory, 0);
  double lo = 1e300, hi = 0;
  for (const auto& [l, p] : all.ranked) lo = std::min(lo, p.memory.total()), hi = std::max(hi, p.memory.total());
  ASSERT_LT(lo, hi);
  const double limit = (lo + hi) / 2;
  long long over = 0;
  for (const auto& [l, p] : all.ranked) over += p.memory.total() > limit;
  const PlanResult some = plan(cfg, node_of(2, limit / 1073741824.0), o);
  EXPECT_EQ(some.pruned_memory, over);
  for (const auto& [l, p] : some.ranked) EXPECT_LE(p.memory.total(), limit);
  // nothing fits: the error says how much the smallest layout needs, and which it is
  expect_one_line_error([&] { plan(cfg, node_of(2, lo / 2 / 1073741824.0), o); },
                        {"tiny.toml", "no layout", "fits", "the smallest needs", fmt::format("{:.1f} GiB",
                                                                                              lo / 1073741824.0)});
}

// The shard levels: tried by default where the device runs them (the CPU), each costed by its
// own memory, and the one that fits chosen where memory binds; on a device that does not run
// them (CUDA, this version) only ZeRO-1 off and on, unless --shard names them.
TEST(Planner, TriesTheShardLevelsWhereTheDeviceRunsThem) {
  Config cfg = tiny_config(8);
  cfg.model.n_layer = 8, cfg.model.d_model = 256;  // many units of like size: the states dominate
  PlanOptions o;
  o.top = 100000;
  o.only_pp = {1};
  o.only_tp = {1};
  ClusterSpec cpu = node_of(4);
  cpu.device.kind = "cpu";
  const PlanResult all = plan(cfg, cpu, o);
  std::map<ShardLevel, double> least;  // each level's smallest memory over the grids
  for (const auto& [l, p] : all.ranked) {
    const double m = p.memory.total();
    least[l.shard] = least.count(l.shard) ? std::min(least[l.shard], m) : m;
  }
  ASSERT_EQ(least.size(), 4u) << "none, optimizer, gradients and weights";
  // Under "weights" its windows too: regathered with the gather posted ahead or not, or kept
  // for the step. Keeping holds every unit; posting at the work exposes every gather.
  std::map<std::pair<bool, int>, std::pair<double, double>> windows;  // -> least memory, least step
  for (const auto& [l, p] : all.ranked)
    if (l.shard == ShardLevel::Weights) {
      auto [it, fresh] = windows.try_emplace({l.shard_keep, l.shard_prefetch}, p.memory.total(), p.step_s);
      it->second = {std::min(it->second.first, p.memory.total()), std::min(it->second.second, p.step_s)};
    }
  ASSERT_EQ(windows.size(), 3u);
  const auto kept = windows[std::pair{true, 1}], at_work = windows[std::pair{false, 0}],
             ahead = windows[std::pair{false, 1}];
  EXPECT_GT(kept.first, at_work.first);
  EXPECT_GT(at_work.second, ahead.second);
  const double others = std::min({least[ShardLevel::None], least[ShardLevel::Optimizer], least[ShardLevel::Gradients]});
  ASSERT_LT(least[ShardLevel::Weights], others);
  // Room for the weights level's layouts only: the plan picks one.
  const double limit = 0.99 * others;
  const PlanResult tight = plan(
      cfg,
      [&] {
        ClusterSpec c = cpu;
        c.device.memory_bytes = limit;
        return c;
      }(),
      o);
  ASSERT_FALSE(tight.ranked.empty());
  for (const auto& [l, p] : tight.ranked) {
    EXPECT_EQ(l.shard, ShardLevel::Weights);
    EXPECT_LE(p.memory.total(), limit) << to_string(l.shard) << " dp " << l.dp << " m " << l.microbatches;
  }
  for (const auto& [l, p] : plan(cfg, node_of(4), o).ranked) EXPECT_LE(l.shard, ShardLevel::Optimizer);
}

TEST(Planner, NoGridIsAnError) {
  Config cfg = tiny_config(2);
  cfg.model.n_layer = 2;
  ClusterSpec c = node_of(1);
  c.nodes = 3;  // 3 devices: pp 3 exceeds the layers, dp 3 does not divide the batch of 2
  expect_one_line_error([&] { plan(cfg, c, PlanOptions{}); }, {"no dp x pp x tp grid of 3 devices", "global batch (2)"});
  PlanOptions o;
  o.precisions = {"fp16"};
  expect_one_line_error([&] { plan(tiny_config(2), node_of(2), o); }, {"test.toml", "fp16"});
}

}  // namespace
}  // namespace pipetrain
