// The cost model (plan/cost_model.hpp) by hand: each unit's parameters against the model's
// declarations, FLOPs, collectives, action times, a rank's memory, and packing's rule.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "pipetrain/model/parameters.hpp"
#include "pipetrain/model/stage.hpp"
#include "pipetrain/plan/cluster.hpp"
#include "pipetrain/plan/cost_model.hpp"
#include "pipetrain/plan/planner.hpp"
#include "pipetrain/plan/product_choice.hpp"
#include "plan_fixtures.hpp"

namespace pipetrain {
namespace {

using namespace testing;

TEST(CostModel, UnitParametersMatchTheModelsDeclarations) {
  ModelConfig llama = tiny_gpt2();
  llama.arch = "llama", llama.n_kv_head = 2, llama.tie_embeddings = false;
  for (const ModelConfig& m : {tiny_gpt2(), llama})
    for (int tp : {1, 2}) {
      const int last = model_num_units(m) - 1;
      // units: the embedding, block 0's attention and MLP halves, and both, the head
      for (const auto& [unit, count, kind] :
           {std::tuple{0, 1, UnitKind::Embedding}, std::tuple{1, 1, UnitKind::Attention},
            std::tuple{2, 1, UnitKind::Mlp}, std::tuple{1, 2, UnitKind::Block}, std::tuple{last, 1, UnitKind::Head}}) {
        const UnitParams want = declared(m, unit, count, tp), got = unit_params(m, kind);
        EXPECT_DOUBLE_EQ(got.on_rank(tp), want.on_rank(tp)) << m.arch << " unit " << unit << " tp " << tp;
        for (bool native : {false, true}) {  // bf16's widened copies, as the store decides them
          ParameterStore one;
          ModelStage a(m, unit, unit + count, one, TensorParallel{0, tp});
          double widened = 0;
          for (const auto& p : one.params())
            if (ParameterStore::needs_widened_copy(p, native)) widened += static_cast<double>(p.numel());
          EXPECT_DOUBLE_EQ(widened_params(m, kind, tp, native), widened)
              << m.arch << " unit " << unit << " tp " << tp << " native " << native;
        }
        if (tp == 2) {
          EXPECT_DOUBLE_EQ(got.replicated, want.replicated) << m.arch << " unit " << unit;
        }
      }
    }
}

TEST(CostModel, Bf16ProductsAreNativeOnGpusAndWhereTheyOutrunFp32) {
  DeviceSpec d;
  EXPECT_FALSE(multiplies_bf16(d));
  d.peak_flops = {{"fp32", 100e9}, {"bf16", 100e9}};  // widened products run at the f32 rate
  EXPECT_FALSE(multiplies_bf16(d));
  d.peak_flops["bf16"] = 400e9;  // AVX512_BF16 / AMX
  EXPECT_TRUE(multiplies_bf16(d));
  d.peak_flops.clear();
  d.kind = "cuda";
  EXPECT_TRUE(multiplies_bf16(d));
}

TEST(CostModel, FlopsByHand) {
  ModelConfig m;  // GPT-2 124M
  const int B = 2, T = 1024, tp = 2;
  const double N = B * T, C = 768, V = 50304;
  const UnitWork b = unit_work(m, UnitKind::Block, tp, B, T);
  EXPECT_DOUBLE_EQ(b.f_flops, (2 * N * 12 * C * C + 2 * N * T * C) / tp);
  EXPECT_DOUBLE_EQ(b.i_flops, (2 * N * 12 * C * C + 4 * N * T * C) / tp);
  EXPECT_DOUBLE_EQ(b.w_flops, 2 * N * 12 * C * C / tp);
  EXPECT_EQ(b.allreduces_f, 2);
  const UnitWork h = unit_work(m, UnitKind::Head, tp, B, T);
  EXPECT_DOUBLE_EQ(h.f_flops + h.i_flops + h.w_flops, 6 * N * V * C / tp);
  // Over the model, the units' FLOPs are model_flops_per_token's 6 N_params + 6 L C T per
  // token, less the parameters no product touches (positions, LayerNorms, biases).
  const UnitWork one = unit_work(m, UnitKind::Block, 1, 1, T), head = unit_work(m, UnitKind::Head, 1, 1, T);
  const double units = (m.n_layer * (one.f_flops + one.i_flops + one.w_flops) + 3 * head.f_flops) / T;
  const double params = 124475904;  // GPT-2 124M with the padded vocabulary
  const double untouched = 1024 * C + m.n_layer * 13 * C + 2 * C;
  EXPECT_NEAR(units, model_flops_per_token(m, static_cast<int64_t>(params), T) - 6 * untouched, 1.0);
}

TEST(CostModel, CollectivesByHand) {
  const LinkSpec l{10e9, 5e-6, 0};
  EXPECT_DOUBLE_EQ(allreduce_seconds(1e9, 4, l), 2 * 3 * 5e-6 + 2.0 * 3 / 4 * 0.1);
  EXPECT_DOUBLE_EQ(allgather_seconds(1e9, 4, l), 3 * 5e-6 + 3.0 / 4 * 0.1);
  EXPECT_DOUBLE_EQ(p2p_seconds(1e9, l), 5e-6 + 0.1);
  EXPECT_EQ(allreduce_seconds(1e9, 1, l), 0);
  const LinkSpec ring{10e9, 5e-6, 5e9};  // a measured all-reduce rate replaces the bandwidth
  EXPECT_DOUBLE_EQ(allreduce_seconds(1e9, 2, ring), 2 * 5e-6 + 0.2);
  ClusterSpec c = parse_cluster(kCluster, "c.toml");  // 4 devices per node
  EXPECT_EQ(&group_link(c, 1, 4), &c.intra_node);
  EXPECT_EQ(&group_link(c, 2, 2), &c.intra_node);
  EXPECT_EQ(&group_link(c, 4, 2), &c.inter_node);
  EXPECT_EQ(&group_link(c, 1, 8), &c.inter_node);
}

TEST(CostModel, ActionTimesByHand) {
  const ClusterSpec c = parse_cluster(kCluster, "c.toml");  // bf16 peak 100 TFLOP/s at 0.5, 1000 GB/s
  const ModelConfig m;
  const int B = 1, T = 1024;
  const double rate = 50e12, bw = 1000e9;
  // an action's FLOPs at the rate, plus its FLOP share of the unit's elementwise bytes
  auto at = [&](const UnitWork& w, double flops) {
    return flops / rate + flops / (w.f_flops + w.i_flops + w.w_flops) * w.bytes / bw;
  };
  const UnitWork w = unit_work(m, UnitKind::Block, 1, B, T, 2);
  EXPECT_DOUBLE_EQ(w.bytes, 1024.0 * 2 * (30 * 768 + 38 * 768));
  const ActionTimes t = unit_times(c, m, UnitKind::Block, 1, B, T, "bf16", Recompute::None);
  EXPECT_DOUBLE_EQ(t.F, at(w, w.f_flops));
  EXPECT_DOUBLE_EQ(t.I, at(w, w.i_flops));
  EXPECT_DOUBLE_EQ(t.W, at(w, w.w_flops));
  EXPECT_EQ(t.tp_comm, 0);
  // tp = 2 inside a node: two all-reduces of N x C floats each way
  const UnitWork w2 = unit_work(m, UnitKind::Block, 2, B, T, 2);
  const double ar = allreduce_seconds(4.0 * B * T * 768, 2, c.intra_node);
  const ActionTimes t2 = unit_times(c, m, UnitKind::Block, 2, B, T, "bf16", Recompute::None);
  EXPECT_DOUBLE_EQ(t2.F, at(w2, w2.f_flops) + 2 * ar);
  EXPECT_DOUBLE_EQ(t2.I, at(w2, w2.i_flops) + 2 * ar);
  EXPECT_DOUBLE_EQ(t2.tp_comm, 4 * ar);
  // full recomputation runs the forward (collectives included) again before backward_input
  const ActionTimes full = unit_times(c, m, UnitKind::Block, 2, B, T, "bf16", Recompute::Full);
  EXPECT_DOUBLE_EQ(full.I, t2.I + t2.F);
  const ActionTimes sel = unit_times(c, m, UnitKind::Block, 2, B, T, "bf16", Recompute::Selective);
  EXPECT_DOUBLE_EQ(sel.I, t2.I + w2.attention_flops / rate);
  // measured rates replace peak x efficiency and include the elementwise work
  ClusterSpec cal = c;
  cal.device.measured["bf16"] = UnitRates{{1024}, {20e12}, {40e12}, 100e9, {}, {}};
  EXPECT_DOUBLE_EQ(unit_times(cal, m, UnitKind::Block, 1, B, T, "bf16", Recompute::None).W, w.w_flops / 20e12);
  EXPECT_DOUBLE_EQ(unit_times(cal, m, UnitKind::Head, 1, B, T, "bf16", Recompute::None).F,
                   unit_work(m, UnitKind::Head, 1, B, T, 2).f_flops / 40e12);
  EXPECT_DOUBLE_EQ(adamw_seconds(1e9, c.device), 28e9 / 1000e9);
}

TEST(CostModel, RankMemoryByHand) {
  MemoryInputs in;
  in.params = 1e6, in.dp = 4, in.zero1 = true, in.bf16 = true;
  in.largest_stash = 1000, in.peak_inflight = 3, in.recompute = 500;
  in.activation_bytes = 10, in.receive_buffers = 4;
  const RankMemory m = rank_memory(in);
  EXPECT_DOUBLE_EQ(m.weights, 4e6);
  EXPECT_DOUBLE_EQ(m.gradients, 4e6);
  EXPECT_DOUBLE_EQ(m.optimizer, 2e6);  // 8 bytes per parameter over 4 replicas
  EXPECT_DOUBLE_EQ(m.compute_copy, 2e6);  // the bf16 copy; nothing widened
  in.widened = 1e5;
  EXPECT_DOUBLE_EQ(rank_memory(in).compute_copy, 2e6 + 4e5);
  EXPECT_DOUBLE_EQ(m.activations, 3500);
  EXPECT_DOUBLE_EQ(m.buffers, 40);
  in.zero1 = false, in.dp = 1, in.bf16 = false;
  EXPECT_DOUBLE_EQ(rank_memory(in).total(), 16e6 + 3500 + 40);
  in.dp = 2, in.reduction_scratch = true;  // MPI's scratch: every gradient's reduction in flight at once
  EXPECT_DOUBLE_EQ(rank_memory(in).buffers, 40 + 4e6);
  in.zero1 = true;  // reduces to owners: twice the message on the other rank, once on the owner
  EXPECT_DOUBLE_EQ(rank_memory(in).buffers, 40 + 4e6 * 1.5);
  in.experts = 2e5, in.expert_dp = 1;  // experts alone in their group: nothing to reduce
  EXPECT_DOUBLE_EQ(rank_memory(in).buffers, 40 + 4 * 8e5 * 1.5);
  in.experts = 0, in.zero1 = false, in.reduction_scratch = false;
  in.not_updated = 2.5e5;  // a tied table's copy updated on another rank: no moments for it
  EXPECT_DOUBLE_EQ(rank_memory(in).optimizer, 8 * 7.5e5);
  in.zero1 = true;  // ZeRO-1's shards cover the whole flat buffer
  EXPECT_DOUBLE_EQ(rank_memory(in).optimizer, 8e6 / 2);
  const double before = rank_memory(in).total();
  in.packed = 3e5;  // runtime.pack_weights: two f32 copies of those matrices
  EXPECT_DOUBLE_EQ(rank_memory(in).packed_copies, 2.4e6);
  EXPECT_DOUBLE_EQ(rank_memory(in).total(), before + 2.4e6);
}

TEST(CostModel, DenseWeightsAreTheProductsMatrices) {
  ModelConfig m = tiny_gpt2();
  const double C = m.d_model, V = m.padded_vocab();
  EXPECT_DOUBLE_EQ(dense_weight_params(m, UnitKind::Embedding, 1), 0.0);  // a lookup
  EXPECT_DOUBLE_EQ(dense_weight_params(m, UnitKind::Attention, 2), 4 * C * C / 2);  // qkv and the projection
  EXPECT_DOUBLE_EQ(dense_weight_params(m, UnitKind::Mlp, 1), 8 * C * C);
  EXPECT_DOUBLE_EQ(dense_weight_params(m, UnitKind::Block, 1), 12 * C * C);
  EXPECT_DOUBLE_EQ(dense_weight_params(m, UnitKind::Head, 2), V * C / 2);  // its vocabulary shard
  // A rank's: with vocabulary parallelism over 4 ranks of tp 2, the output layer is every
  // rank's eighth of it, the last stage's too, and the embedding's rank multiplies by it.
  const std::vector<StagePiece> last{{UnitKind::Block, 1}, {UnitKind::Head}}, first{{UnitKind::Embedding}};
  EXPECT_DOUBLE_EQ(rank_dense_weight_params(m, last, 2, 0), 12 * C * C / 2 + V * C / 2);
  EXPECT_DOUBLE_EQ(rank_dense_weight_params(m, last, 2, 8), 12 * C * C / 2 + V * C / 8);
  EXPECT_DOUBLE_EQ(rank_dense_weight_params(m, first, 2, 0), 0.0);
  EXPECT_DOUBLE_EQ(rank_dense_weight_params(m, first, 2, 8), V * C / 8);
  // Llama: q, k and v by key/value heads, the output, gate, up and down.
  m.arch = "llama", m.n_head = 4, m.n_kv_head = 2;
  const double hd = C / 4;
  EXPECT_DOUBLE_EQ(dense_weight_params(m, UnitKind::Block, 1), C * (4 + 2 * 2) * hd + C * C + 3 * C * m.ffn());
}

// runtime.pack_weights = "auto": each condition alone turns packing off, at its boundary.
TEST(CostModel, AutoPacksOnlyWhereItWasMeasuredToPay) {
  PackInputs in;
  in.can_pack = true;
  in.d_model = kPackModelMin;
  in.rows = kPackRowsMax;
  in.microbatches = 2;
  in.copies_bytes = 0.25 * 8e9;
  in.memory_per_rank = 8e9;
  const PackChoice yes = choose_pack_weights(in);
  EXPECT_TRUE(yes.on) << yes.why;
  EXPECT_NE(yes.why.find("512-row microbatches; copies 1.9 GiB, 25.0% of the rank's 7.5 GiB"), std::string::npos) << yes.why;
  auto off = [&](auto change, const char* why) {
    PackInputs x = in;
    change(x);
    const PackChoice c = choose_pack_weights(x);
    EXPECT_FALSE(c.on) << why;
    EXPECT_NE(c.why.find(why), std::string::npos) << c.why;
  };
  off([](PackInputs& x) { x.can_pack = false; }, "in place");
  off([](PackInputs& x) { x.f32_products = false; }, "bf16");
  off([](PackInputs& x) { x.d_model = kPackModelMin - 1; }, "not measured to pay");
  off([](PackInputs& x) { x.rows = kPackRowsMax + 1; }, "513-row microbatches");
  off([](PackInputs& x) { x.microbatches = 1; }, "fewer than 2 microbatches a step");
  off([](PackInputs& x) { x.copies_bytes = 0.26 * 8e9; }, "over a quarter of the rank's 7.5 GiB");
  PackInputs unknown = in;  // no memory figure: the copies are not limited
  unknown.memory_per_rank = 0;
  unknown.copies_bytes = 1e15;
  EXPECT_TRUE(choose_pack_weights(unknown).on);
}

}  // namespace
}  // namespace pipetrain
