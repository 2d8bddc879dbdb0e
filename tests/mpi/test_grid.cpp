// Tensor and data parallelism on every dp x pp x tp grid that fits the world size:
// 5 steps with 1f1b and zb-h1, gradient clipping on and off, ZeRO-1 on and off, give
// the single-rank run's losses and parameters — in fp32, and in bf16 against the
// single-rank bf16 run; and the same with the vocabulary split over the pipeline.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "mpi/mpi_fixtures.hpp"
#include "pipetrain/core/error.hpp"

namespace pipetrain {
namespace {

using namespace testing;

struct GridCase {
  int dp, pp, tp;
};

Config grid_config(GridCase g, const std::string& schedule, double clip, bool zero1) {
  Config c = tiny_run_config();
  c.model.n_layer = 4;
  c.model.vocab_size = 100;  // padded 128: with tp = 2 the second slice is partly padding
  c.train.microbatches = 2;
  // AdamW turns the rounding noise of near-zero gradients into steps of size lr, so a
  // different summation order moves such elements by O(lr): keep lr realistic.
  c.train.lr = 3e-3;
  c.train.grad_clip = clip;
  c.parallel.dp = g.dp;
  c.parallel.pp = g.pp;
  c.parallel.tp = g.tp;
  c.parallel.zero1 = zero1;
  c.schedule.name = schedule;
  return c;
}

std::vector<GridCase> grids_for(int world) {
  std::vector<GridCase> all = {{1, 1, 2}, {2, 1, 1}, {2, 2, 1}, {1, 2, 2}, {2, 1, 2}, {2, 2, 2}};
  std::vector<GridCase> out;
  for (auto g : all)
    if (g.dp * g.pp * g.tp == world) out.push_back(g);
  return out;
}

TEST(GridMatchesSingleRank, EveryGridScheduleClipAndZero1) {
  const auto grids = grids_for(world_size());
  if (grids.empty()) GTEST_SKIP() << "no grid of the list has " << world_size() << " ranks";
  for (double clip : {0.0, 0.05}) {
    const RunResult ref = run(grid_config({1, 1, 1}, "1f1b", clip, false), MPI_COMM_SELF);
    for (GridCase g : grids)
      for (const char* sched : {"1f1b", "zb-h1"})
        for (bool zero1 : {false, true}) {
          if (zero1 && g.dp == 1) continue;
          SCOPED_TRACE(::testing::Message() << "grid dp " << g.dp << " pp " << g.pp << " tp " << g.tp << ", " << sched
                                            << ", clip " << clip << ", zero1 " << zero1);
          const Config cfg = grid_config(g, sched, clip, zero1);
          expect_same_run(run(cfg, MPI_COMM_WORLD), ref, cfg);
        }
  }
}

TEST(GridMatchesSingleRank, Bf16GridsReproduceTheSingleRankBf16Run) {
  const auto grids = grids_for(world_size());
  if (grids.empty()) GTEST_SKIP() << "no grid of the list has " << world_size() << " ranks";
  Config base = grid_config({1, 1, 1}, "1f1b", 0.05, false);
  base.train.precision = "bf16";
  const RunResult ref = run(base, MPI_COMM_SELF);
  for (GridCase g : grids)
    for (const char* sched : {"1f1b", "zb-h1"})
      for (bool zero1 : {false, true}) {
        if (zero1 && g.dp == 1) continue;
        SCOPED_TRACE(::testing::Message() << "bf16, grid dp " << g.dp << " pp " << g.pp << " tp " << g.tp << ", "
                                          << sched << ", zero1 " << zero1);
        Config cfg = grid_config(g, sched, 0.05, zero1);
        cfg.train.precision = "bf16";
        expect_same_run(run(cfg, MPI_COMM_WORLD), ref, cfg);
      }
}

// The bounds catch what they guard against: on dp = 2, replica 1 reading its samples one
// sample late at step 3 of 5 (run_compare.hpp: DataFault) must fail the comparison with the
// single-rank run, in fp32 and in bf16 (the layout bound of runs that round at the same
// points). Every rank's recorded failures are counted.
TEST(GridMatchesSingleRank, BoundsCatchAOneRankOneStepDataFault) {
  if (world_size() != 2) GTEST_SKIP() << "runs on 2 ranks (dp 2)";
  for (const char* precision : {"fp32", "bf16"}) {
    Config single = grid_config({1, 1, 1}, "1f1b", 0.05, false), cfg = grid_config({2, 1, 1}, "1f1b", 0.05, false);
    single.train.precision = cfg.train.precision = precision;
    const RunResult ref = run(single, MPI_COMM_SELF);
    const RunResult faulty = run(cfg, MPI_COMM_WORLD, faulty_pattern_source(cfg, DataFault{1, 3}));
    ::testing::TestPartResultArray caught;
    {
      ::testing::ScopedFakeTestPartResultReporter intercept(
          ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &caught);
      expect_same_run(faulty, ref, cfg);
    }
    int failures = caught.size();
    MPI_Allreduce(MPI_IN_PLACE, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    EXPECT_GT(failures, 0) << precision << ": a data fault on rank 1 at step 3 passed the comparison";
    if (world_rank() == 0) std::printf("  %s: the fault failed %d checks over the ranks\n", precision, failures);
  }
}

// Llama (grouped-query attention, RoPE, SwiGLU, RMSNorm) on the same grids and bounds,
// untied and tied heads, plus interleaved and V placements where the pipeline has two
// ranks (with tp or dp beside it).
Config llama_config(GridCase g, const std::string& schedule, bool tied, bool zero1, int virtual_stages = 1) {
  Config c = grid_config(g, schedule, 0.05, zero1);
  c.model.arch = "llama";
  c.model.n_head = 4;
  c.model.n_kv_head = 2;  // tp = 2: one key/value head per rank
  c.model.ffn_hidden = 32;
  c.model.rope_theta = 10000;
  c.model.tie_embeddings = tied;
  c.parallel.virtual_stages = virtual_stages;
  return c;
}

TEST(GridMatchesSingleRank, LlamaOnEveryGridUntiedAndTied) {
  const auto grids = grids_for(world_size());
  if (grids.empty()) GTEST_SKIP() << "no grid of the list has " << world_size() << " ranks";
  for (bool tied : {false, true}) {
    const RunResult ref = run(llama_config({1, 1, 1}, "1f1b", tied, false), MPI_COMM_SELF);
    for (GridCase g : grids) {
      struct Sched {
        const char* name;
        int v;
      };
      std::vector<Sched> scheds = {{"1f1b", 1}, {"zb-h1", 1}};
      if (g.pp == 2) scheds.insert(scheds.end(), {{"interleaved-1f1b", 2}, {"zbv", 2}});
      for (Sched sc : scheds)
        for (bool zero1 : {false, true}) {
          if (zero1 && g.dp == 1) continue;
          SCOPED_TRACE(::testing::Message() << "llama " << (tied ? "tied" : "untied") << ", grid dp " << g.dp << " pp "
                                            << g.pp << " tp " << g.tp << ", " << sc.name << ", zero1 " << zero1);
          const Config cfg = llama_config(g, sc.name, tied, zero1, sc.v);
          expect_same_run(run(cfg, MPI_COMM_WORLD), ref, cfg);
        }
    }
  }
}

// Packed documents (data.pack_documents, run_compare.hpp's packed_pattern_source): every
// stage reads each microbatch's positions, the loss averages the targets that count; GPT-2
// (learned positions) under 1f1b, Llama (rotary angles, grouped-query attention) under
// zb-h1, on every grid of the world's size, match the single-rank packed run.
TEST(GridMatchesSingleRank, PackedDocumentsOnEveryGrid) {
  const auto grids = grids_for(world_size());
  if (grids.empty()) GTEST_SKIP() << "no grid of the list has " << world_size() << " ranks";
  for (bool llama : {false, true}) {
    auto config = [&](GridCase g) {
      return llama ? llama_config(g, "zb-h1", false, false) : grid_config(g, "1f1b", 0.05, false);
    };
    const int T = config({1, 1, 1}).train.seq_len;
    const RunResult ref = run(config({1, 1, 1}), MPI_COMM_SELF, packed_pattern_source(T));
    for (GridCase g : grids) {
      SCOPED_TRACE(::testing::Message() << (llama ? "llama" : "gpt2") << " packed, grid dp " << g.dp << " pp " << g.pp
                                        << " tp " << g.tp);
      const Config cfg = config(g);
      expect_same_run(run(cfg, MPI_COMM_WORLD, packed_pattern_source(T)), ref, cfg);
    }
  }
}

// Llama with a dense first block, then MoE blocks (make_tiny_moe).
Config moe_config(GridCase g, const std::string& sched, bool zero1, int v) {
  Config c = llama_config(g, sched, false, zero1, v);
  make_tiny_moe(c);
  c.train.microbatches = g.dp == 4 ? 2 : 4;  // dualpipev: at least 2 per rank
  return c;
}

// Mixture of experts (model.n_experts, moe_config) on every grid of the list without tp,
// 1f1b, zb-h1 and dualpipev (its V where the pipeline has one or two ranks: its F&B pairs
// overlapped, and under ep the same values bit for bit with schedule.overlap = false),
// ZeRO-1 (with ep > 1 under zb-h1: the experts' moments sharded over the dp / ep ranks holding
// them), expert parallelism over 2 and 4 dp ranks. The load-balancing loss is a microbatch's (not linear
// in its tokens), so the reference has the same microbatches: dp x as many, each as large
// as a replica's.
TEST(GridMatchesSingleRank, MixtureOfExpertsOnEveryGridWithoutTensorParallelism) {
  std::vector<GridCase> grids;
  for (GridCase g : std::vector<GridCase>{{1, 2, 1}, {2, 1, 1}, {1, 4, 1}, {2, 2, 1}, {4, 1, 1}})
    if (g.dp * g.pp * g.tp == world_size()) grids.push_back(g);
  if (grids.empty()) GTEST_SKIP() << "no grid of the list without tp has " << world_size() << " ranks";
  for (GridCase g : grids) {
    Config single = moe_config({1, 1, 1}, "1f1b", false, 1);
    single.train.microbatches = moe_config(g, "1f1b", false, 1).train.microbatches * g.dp;
    const RunResult ref = run(single, MPI_COMM_SELF);
    std::vector<std::pair<const char*, int>> scheds = {{"1f1b", 1}, {"zb-h1", 1}};
    if (g.pp <= 2) scheds.push_back({"dualpipev", 2});
    for (const auto& [sched, v] : scheds)
      for (int ep : {1, 2, 4})
        for (bool zero1 : {false, true}) {
          if ((zero1 && (g.dp == 1 || (ep > 1 && std::string(sched) != "zb-h1"))) || g.dp % ep) continue;
          SCOPED_TRACE(::testing::Message() << "mixture of experts, grid dp " << g.dp << " pp " << g.pp << ", " << sched
                                            << ", ep " << ep << ", zero1 " << zero1);
          Config cfg = moe_config(g, sched, zero1, v);
          cfg.parallel.ep = ep;
          const RunResult got = run(cfg, MPI_COMM_WORLD);
          expect_same_run(got, ref, cfg);
          if (std::string(sched) != "dualpipev" || ep == 1) continue;
          cfg.schedule.overlap = false;  // the pairs one after the other: the same sums in the same order
          const RunResult in_order = run(cfg, MPI_COMM_WORLD);
          EXPECT_EQ(in_order.losses, got.losses);
          EXPECT_EQ(in_order.params, got.params);
          // Tied: the head's weight gradient (run at once) and the embedding's (queued) share
          // one gradient, whose terms must still come in the program's order.
          cfg.model.tie_embeddings = true;
          const RunResult tied_in_order = run(cfg, MPI_COMM_WORLD);
          cfg.schedule.overlap = true;
          const RunResult tied = run(cfg, MPI_COMM_WORLD);
          EXPECT_EQ(tied_in_order.losses, tied.losses) << "tied";
          EXPECT_EQ(tied_in_order.params, tied.params) << "tied";
        }
    if (g.pp != 2) continue;
    // A stage that begins with block 1's experts, its attention on the stage before.
    SCOPED_TRACE(::testing::Message() << "mixture of experts, grid dp " << g.dp << " pp 2, split 1.5,2.5");
    Config half = moe_config(g, "zb-h1", false, 1);
    half.parallel.layers_per_stage = {1.5, 2.5};
    expect_same_run(run(half, MPI_COMM_WORLD), ref, half);
  }
}

// Tensor-parallel experts (each expert's width split over tp, as the dense MLP's) beside
// dp, pp and ep, on the same model and reference: grids with tp = 2 (8 ranks: dp 4 with
// ep = 4, and dp 2 x pp 2), 1f1b and
// dualpipev (its F&B pairs taking turns under tp; with ep = dp),
// zb-h1 with ZeRO-1 (ep 1 and 2: on 8 ranks two ranks share each expert's moments);
// and bf16 (ep = dp) against the single-rank bf16 run.
TEST(GridMatchesSingleRank, MixtureOfExpertsWithTensorParallelExperts) {
  std::vector<GridCase> grids;
  for (GridCase g : std::vector<GridCase>{{1, 1, 2}, {2, 1, 2}, {1, 2, 2}, {4, 1, 2}, {2, 2, 2}})
    if (g.dp * g.pp * g.tp == world_size()) grids.push_back(g);
  if (grids.empty()) GTEST_SKIP() << "no grid of the list with tp has " << world_size() << " ranks";
  for (GridCase g : grids) {
    Config single = moe_config({1, 1, 1}, "1f1b", false, 1);
    single.train.microbatches = moe_config(g, "1f1b", false, 1).train.microbatches * g.dp;
    const RunResult ref = run(single, MPI_COMM_SELF);
    struct Case {
      const char* sched;
      int v, ep;
      bool zero1;
    };
    std::vector<Case> cases = {{"1f1b", 1, 1, false}, {"zb-h1", 1, 1, g.dp > 1}, {"dualpipev", 2, g.dp, false}};
    if (g.dp > 1) cases.push_back({"zb-h1", 1, 2, true});
    for (Case c : cases) {
      SCOPED_TRACE(::testing::Message() << "tensor-parallel experts, grid dp " << g.dp << " pp " << g.pp << " tp "
                                        << g.tp << ", " << c.sched << ", ep " << c.ep << ", zero1 " << c.zero1);
      Config cfg = moe_config(g, c.sched, c.zero1, c.v);
      cfg.parallel.ep = c.ep;
      expect_same_run(run(cfg, MPI_COMM_WORLD), ref, cfg);
    }
    SCOPED_TRACE(::testing::Message() << "bf16 experts, grid dp " << g.dp << " pp " << g.pp << " tp " << g.tp << ", ep "
                                      << g.dp << ", against the single-rank bf16 run");
    single.train.precision = "bf16";
    Config cfg = moe_config(g, "1f1b", false, 1);
    cfg.parallel.ep = g.dp;
    cfg.train.precision = "bf16";
    expect_same_run(run(cfg, MPI_COMM_WORLD), run(single, MPI_COMM_SELF), cfg);
  }
}

// Vocabulary parallelism (parallel.vocab_parallel): every pipeline x tensor-parallel rank
// holds a slice of the embedding and the output layer, joined by collectives; on every grid
// of the list with a pipeline, GPT-2 (tied) and Llama (untied and tied) under 1f1b and zb-h1,
// and at pp = 2 under every schedule kind (gpipe, interleaved-1f1b, looped-bfs, zbv,
// dualpipev), ZeRO-1, and bf16 (zb-h1; the slices round other values than one rank:
// Bf16Rounding::OtherPoints), the same run within the bounds. With tp = 2 at pp = 2 the padded 128 rows
// make four slices, the last of them padding but 4 rows.
TEST(GridMatchesSingleRank, VocabParallelOnEveryPipelineGrid) {
  std::vector<GridCase> grids;
  for (GridCase g : std::vector<GridCase>{{1, 2, 1}, {1, 4, 1}, {2, 2, 1}, {1, 2, 2}, {2, 2, 2}})
    if (g.dp * g.pp * g.tp == world_size()) grids.push_back(g);
  if (grids.empty()) GTEST_SKIP() << "no grid of the list with a pipeline has " << world_size() << " ranks";
  struct Model {
    const char* arch;
    bool tied;
  };
  for (Model model : {Model{"gpt2", true}, Model{"llama", false}, Model{"llama", true}}) {
    const std::string arch = model.arch;
    auto config = [&](GridCase g, const std::string& sched, bool zero1, int v) {
      Config c = arch == "gpt2" ? grid_config(g, sched, 0.05, zero1) : llama_config(g, sched, model.tied, zero1, v);
      c.parallel.virtual_stages = v;
      if (sched == "dualpipev") c.train.microbatches = 4;  // its V needs 2 per rank
      return c;
    };
    const RunResult ref = run(config({1, 1, 1}, "1f1b", false, 1), MPI_COMM_SELF);
    for (GridCase g : grids) {
      std::vector<std::pair<const char*, int>> scheds = {{"1f1b", 1}, {"zb-h1", 1}};
      if (g.pp == 2)
        scheds.insert(scheds.end(), {{"gpipe", 1}, {"interleaved-1f1b", 2}, {"looped-bfs", 2}, {"zbv", 2}, {"dualpipev", 2}});
      for (const auto& [sched, v] : scheds)
        for (bool zero1 : {false, true}) {
          if (zero1 && g.dp == 1) continue;
          SCOPED_TRACE(::testing::Message()
                       << "vocabulary parallel, " << arch << (model.tied ? " tied" : " untied") << ", grid dp " << g.dp
                       << " pp " << g.pp << " tp " << g.tp << ", " << sched << ", zero1 " << zero1);
          Config cfg = config(g, sched, zero1, v);
          cfg.parallel.vocab_parallel = Toggle::On;
          expect_same_run(run(cfg, MPI_COMM_WORLD), ref, cfg);
        }
    }
  }
  Config bf16 = grid_config({1, 1, 1}, "1f1b", 0.05, false);
  bf16.train.precision = "bf16";
  const RunResult ref = run(bf16, MPI_COMM_SELF);
  for (GridCase g : grids) {
    SCOPED_TRACE(::testing::Message() << "vocabulary parallel, bf16, grid dp " << g.dp << " pp " << g.pp << " tp "
                                      << g.tp);
    Config cfg = grid_config(g, "zb-h1", 0.05, false);
    cfg.train.precision = "bf16";
    cfg.parallel.vocab_parallel = Toggle::On;
    expect_same_run(run(cfg, MPI_COMM_WORLD), ref, cfg, Bf16Rounding::OtherPoints);
  }
}

// Evaluation under vocabulary parallelism (a forward-only program of slices, the loss from
// every slice's statistics) gives the whole model's validation loss: the same sums in the
// same order as the loss the training steps above compare (gradient_bound's e).
TEST(GridMatchesSingleRank, VocabParallelEvaluatesAsTheWholeModel) {
  if (world_size() != 2) GTEST_SKIP() << "needs 2 ranks (pp 2)";
  const Config whole = grid_config({1, 2, 1}, "1f1b", 0.05, false);
  Config split = whole;
  split.parallel.vocab_parallel = Toggle::On;
  auto backend = make_cpu_backend();
  const int T = whole.train.seq_len;
  const BatchSource source = [T](int64_t f, int n, int32_t* in, int32_t* tgt) { pattern(f, n, in, tgt, T); };
  Grid g1(MPI_COMM_WORLD, whole.parallel), g2(MPI_COMM_WORLD, split.parallel);
  Trainer a(whole, g1, *backend, source), b(split, g2, *backend, source);
  const double la = a.evaluate(source, 0, 8), lb = b.evaluate(source, 0, 8);
  EXPECT_NEAR(lb, la, gradient_bound(whole) * la) << "on rank " << world_rank();
}

// Megatron's scatter-gather: under tp each rank sends only its 1/tp slice of every
// activation and gradient that crosses stages and the receivers all-gather it (the grid
// tests above show the losses unchanged). Gathered from every rank: at pp 2 x tp 2 each
// sends half of what the same pipeline sends at tp 1.
TEST(GridTransfers, TensorParallelStagesSendTheirSliceOnly) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks (pp 2 x tp 2 against pp 2 x dp 2)";
  Config tp2 = grid_config({1, 2, 2}, "1f1b", 0.0, false), dp2 = grid_config({2, 2, 1}, "1f1b", 0.0, false);
  tp2.train.steps = dp2.train.steps = 1;
  dp2.train.global_batch = 2 * tp2.train.global_batch;  // the same microbatch size per pipeline
  const double with_tp = run(tp2, MPI_COMM_WORLD).bytes_sent.at(0);
  const double without = run(dp2, MPI_COMM_WORLD).bytes_sent.at(0);
  std::vector<double> all(8);
  const double mine[2] = {with_tp, without};
  MPI_Allgather(mine, 2, MPI_DOUBLE, all.data(), 2, MPI_DOUBLE, MPI_COMM_WORLD);
  for (int r = 0; r < 4; ++r) {
    SCOPED_TRACE(::testing::Message() << "rank " << r);
    EXPECT_GT(all[2 * r + 1], 0.0);
    EXPECT_EQ(all[2 * r], all[2 * r + 1] / 2) << "tp 2 sends half of every tensor";
  }
  if (world_rank() == 0) std::printf("  pipeline bytes sent per rank per step: tp 1 %.0f, tp 2 %.0f\n", all[1], all[0]);
}

// Data parallelism's reduction variants against the single-rank run: the embedding's rows
// exchanged (few tokens against the table) or its dense table all-reduced (many), each
// with buckets small enough that parameters go out in pieces and large enough for one
// bucket; GPT-2 (tied head on the same rank) and Llama (untied); all-reduced, and with
// ZeRO-1 reduced to each range's owner (tiny buckets cross the ranks' range boundaries).
TEST(DataParallelReduction, RowExchangeDenseTableAndBucketSizesMatchSingleRank) {
  const int dp = world_size();
  if (dp < 2 || 8 % dp != 0) GTEST_SKIP() << "needs 2, 4 or 8 replicas (a global batch of 8 sequences)";
  struct Case {
    const char* arch;
    int global_batch;  // sequences of 8 tokens per step, over all replicas
    bool rows;         // expected: the step's tokens < the table's 128 rows (vocabulary 100, padded)
  };
  for (Case k : {Case{"gpt2", 8, true}, Case{"gpt2", 16, false}, Case{"llama", 8, true}})
    for (double mb : {0.0002, 25.0})  // 52 floats per bucket: many, parameters in pieces; one
      for (bool zero1 : {false, true}) {
        SCOPED_TRACE(::testing::Message() << k.arch << " batch " << k.global_batch << " bucket " << mb << " MiB, dp "
                                          << dp << ", zero1 " << zero1);
        Config c = tiny_run_config();
        c.model.arch = k.arch;
        c.model.n_layer = 2;
        c.model.vocab_size = 100;
        c.train.global_batch = k.global_batch;
        c.train.microbatches = 1;
        c.parallel.dp_bucket_mb = mb;
        const RunResult ref = run(c, MPI_COMM_SELF);
        c.parallel.dp = dp;
        c.parallel.zero1 = zero1;
        {
          auto backend = make_cpu_backend();
          Grid grid(MPI_COMM_WORLD, c.parallel, c.source);
          Trainer t(c, grid, *backend, [](int64_t, int, int32_t*, int32_t*) {});
          ASSERT_NE(t.dp_reducer(), nullptr);
          EXPECT_EQ(t.dp_reducer()->exchanges_embedding_rows(), k.rows);
        }
        expect_same_run(run(c, MPI_COMM_WORLD), ref, c);
      }
}

TEST(GridErrors, TensorParallelMustDivideHeadsAndVocabulary) {
  if (world_size() < 2) GTEST_SKIP() << "needs at least 2 ranks";
  Config c = tiny_run_config();
  c.parallel.tp = world_size();
  c.model.n_head = 1;
  c.model.d_model = 16;
  EXPECT_THROW(validate_config(c), Error);
  try {
    validate_config(c);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.n_head"), std::string::npos) << e.what();
  }
  c = tiny_run_config();
  c.parallel.dp = world_size();
  c.train.global_batch = world_size() * c.train.microbatches + 1;
  try {
    validate_config(c);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.global_batch"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pipetrain
