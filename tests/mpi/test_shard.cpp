// Sharded data parallelism (parallel.shard = "gradients" | "weights"): every level on every
// dp x pp x tp grid of the world's size, under 1f1b, zb-h1 (its split weight-gradient work),
// dualpipev and interleaved placements, GPT-2 (tied table on two ranks), Llama and a mixture
// of experts (its experts sharded over the ranks holding them), hybrid groups, recomputation
// and context parallelism, gives the single-rank run's losses,
// gradients and parameters within the grid suite's bounds; a run saved at one level resumes
// at any other bit for bit; and the weights a rank stores under "weights" are its shard.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
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

Config shard_config(GridCase g, const std::string& schedule, const std::string& level, bool llama = false) {
  Config c = tiny_run_config();
  c.model.n_layer = 4;
  c.model.vocab_size = 100;
  if (llama) {
    make_tiny_llama(c);
    c.model.tie_embeddings = true;
  }
  c.train.microbatches = 2;
  c.train.lr = 3e-3;  // the grid suite's: rounding noise moves near-zero elements by O(lr)
  c.train.grad_clip = 0.05;
  c.parallel.dp = g.dp;
  c.parallel.pp = g.pp;
  c.parallel.tp = g.tp;
  c.parallel.shard = level;
  c.schedule.name = schedule;
  if (schedule == "dualpipev" || schedule == "interleaved-1f1b") c.parallel.virtual_stages = 2;
  if (schedule == "dualpipev") c.train.microbatches = 2 * g.pp;  // its least
  return c;
}

std::vector<GridCase> sharded_grids(int world) {
  std::vector<GridCase> out;
  for (GridCase g : std::vector<GridCase>{{2, 1, 1}, {2, 2, 1}, {2, 1, 2}, {4, 1, 1}, {2, 2, 2}})
    if (g.dp * g.pp * g.tp == world) out.push_back(g);
  return out;
}

TEST(ShardedDataParallel, EveryLevelOnEveryGridMatchesTheSingleRankRun) {
  const auto grids = sharded_grids(world_size());
  if (grids.empty()) GTEST_SKIP() << "no grid with dp > 1 has " << world_size() << " ranks";
  for (bool llama : {false, true}) {
    Config single = shard_config({1, 1, 1}, "1f1b", "none", llama);
    const RunResult ref = run(single, MPI_COMM_SELF);
    for (GridCase g : grids) {
      struct Case {
        const char* schedule;
        const char* level;
        const char* reuse;
        int group = 0;  // parallel.shard_group
      };
      std::vector<Case> cases = {
          {"1f1b", "gradients", "regather"}, {"1f1b", "weights", "regather"}, {"zb-h1", "weights", "keep"}};
      if (g.dp == 4) cases.insert(cases.end(), {{"1f1b", "weights", "regather", 2}, {"zb-h1", "gradients", "keep", 2}});
      if (g.dp == 2 && g.pp == 1) cases.push_back({"1f1b", "weights", "keep", 1});  // groups of one: in place
      if (g.pp == 2)
        cases.insert(cases.end(), {{"dualpipev", "weights", "regather"}, {"interleaved-1f1b", "gradients", "keep"}});
      for (const Case& c : cases) {
        if (llama && std::string(c.schedule) == "interleaved-1f1b") continue;
        SCOPED_TRACE(::testing::Message()
                     << (llama ? "llama" : "gpt2") << ", grid dp " << g.dp << " pp " << g.pp << " tp " << g.tp << ", "
                     << c.schedule << ", shard " << c.level << " (" << c.reuse << ", group " << c.group << ")");
        Config cfg = shard_config(g, c.schedule, c.level, llama);
        cfg.parallel.shard_reuse = c.reuse;
        cfg.parallel.shard_group = c.group;
        expect_same_run(run(cfg, MPI_COMM_WORLD), ref, cfg);
      }
    }
  }
}

// bf16 under "gradients": the whole weights and their bf16 copies stay (refreshed after each
// update's gather), the gradients and moments are parts. Under "weights": each rank rounds
// its part, the gathers carry bf16 and make the unit's bf16 and widened copies (no whole f32
// values). Both give the single-rank bf16 run within the bound of runs that round at the
// same points, under 1f1b and zb-h1 (its weight passes read the copies later).
TEST(ShardedDataParallel, Bf16MatchesTheSingleRankBf16Run) {
  const auto grids = sharded_grids(world_size());
  if (grids.empty()) GTEST_SKIP() << "no grid with dp > 1 has " << world_size() << " ranks";
  for (bool llama : {false, true}) {
    Config single = shard_config({1, 1, 1}, "1f1b", "none", llama);
    single.train.precision = "bf16";
    const RunResult ref = run(single, MPI_COMM_SELF);
    for (GridCase g : grids)
      for (const auto& [schedule, level] :
           {std::pair{"1f1b", "gradients"}, {"1f1b", "weights"}, {"zb-h1", "weights"}}) {
        SCOPED_TRACE(::testing::Message() << (llama ? "llama" : "gpt2") << ", bf16, grid dp " << g.dp << " pp " << g.pp
                                          << " tp " << g.tp << ", " << schedule << ", shard " << level);
        Config cfg = shard_config(g, schedule, level, llama);
        cfg.train.precision = "bf16";
        expect_same_run(run(cfg, MPI_COMM_WORLD), ref, cfg);
      }
  }
}

// Recomputation, full (the backward runs each layer's forward again: it reads gathered
// weights) and selective, and context parallelism (its ranks are replicas too: the units
// shard over dp x cp), under "weights".
TEST(ShardedDataParallel, RecomputationAndContextParallelism) {
  if (world_size() != 4) GTEST_SKIP() << "runs on 4 ranks (dp 2 x pp 2, dp 2 x cp 2)";
  for (const char* recompute : {"full", "selective"}) {
    Config single = shard_config({1, 1, 1}, "1f1b", "none", true);
    single.train.recompute = recompute;
    const RunResult ref = run(single, MPI_COMM_SELF);
    Config pipeline = shard_config({2, 2, 1}, "zb-h1", "weights", true),
           context = shard_config({2, 1, 1}, "1f1b", "weights", true);
    context.parallel.cp = 2;
    for (Config* cfg : {&pipeline, &context}) {
      SCOPED_TRACE(::testing::Message() << "recompute " << recompute << ", dp 2 x pp " << cfg->parallel.pp << " x cp "
                                        << cfg->parallel.cp);
      cfg->train.recompute = recompute;
      expect_same_run(run(*cfg, MPI_COMM_WORLD), ref, *cfg);
    }
  }
}

// A mixture of experts (make_tiny_moe). The load-balancing loss is a microbatch's (not linear in its tokens), so every
// run's microbatches are one sequence each, the single-rank run's too.
Config moe_shard_config(GridCase g, const std::string& schedule, const std::string& level, int ep) {
  Config c = shard_config(g, schedule, level, true);
  make_tiny_moe(c);
  c.parallel.ep = ep;
  c.train.microbatches = c.train.global_batch / g.dp;
  return c;
}

// Experts under "gradients" and "weights": with ep < dp a layer's experts are a unit of
// their own, sharded over the dp / ep ranks holding them (ep 2 of dp 4: two each); with
// ep = dp, or a shard group of ep ranks, one rank of the group holds them and uses them in
// place; with ep = 1 they are in the layer's unit, sharded over every replica. Each gives the
// single-rank run within the grid suite's bounds, under 1f1b and zb-h1.
TEST(ShardedDataParallel, MixtureOfExpertsShardsTheExpertsOverTheRanksHoldingThem) {
  if (world_size() != 2 && world_size() != 4) GTEST_SKIP() << "runs on 2 ranks (dp 2) and 4 (dp 4, dp 2 x pp 2)";
  const RunResult ref = run(moe_shard_config({1, 1, 1}, "1f1b", "none", 1), MPI_COMM_SELF);
  struct Case {
    GridCase g;
    const char* schedule;
    const char* level;
    int ep, group;
  };
  const std::vector<Case> cases = world_size() == 2 ? std::vector<Case>{{{2, 1, 1}, "1f1b", "weights", 2, 0},
                                                                        {{2, 1, 1}, "zb-h1", "gradients", 2, 0},
                                                                        {{2, 1, 1}, "1f1b", "weights", 1, 0}}
                                                    : std::vector<Case>{{{4, 1, 1}, "1f1b", "weights", 2, 0},
                                                                        {{4, 1, 1}, "zb-h1", "gradients", 2, 0},
                                                                        {{4, 1, 1}, "1f1b", "weights", 2, 2},
                                                                        {{2, 2, 1}, "zb-h1", "weights", 2, 0}};
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "experts, grid dp " << c.g.dp << " pp " << c.g.pp << ", " << c.schedule
                                      << ", shard " << c.level << ", ep " << c.ep << ", group " << c.group);
    Config cfg = moe_shard_config(c.g, c.schedule, c.level, c.ep);
    cfg.parallel.shard_group = c.group;
    expect_same_run(run(cfg, MPI_COMM_WORLD), ref, cfg);
  }
}

// A router's selection bias (model.router_bias_rate) is state no optimizer touches: under
// "weights" every rank keeps it whole, and it moves by the step's loads exactly as in an
// unsharded run — after one step (the same weights, so the same routing), bit for bit.
TEST(ShardedDataParallel, TheSelectionBiasStaysWholeUnderShardedWeights) {
  if (world_size() != 2) GTEST_SKIP() << "runs on 2 ranks (dp 2, ep 2)";
  Config sharded = moe_shard_config({2, 1, 1}, "1f1b", "weights", 2);
  sharded.model.router_bias_rate = 0.05;
  sharded.train.steps = 1;
  Config whole = sharded;
  whole.parallel.shard = "none";
  const RunResult got = run(sharded, MPI_COMM_WORLD), want = run(whole, MPI_COMM_WORLD);
  int biases = 0;
  for (int b = sharded.model.first_dense; b < sharded.model.n_layer; ++b) {
    const std::string name = "h." + std::to_string(b) + ".moe.router.bias";
    ASSERT_TRUE(got.params.count(name)) << name;
    EXPECT_EQ(got.params.at(name), want.params.at(name)) << name;
    EXPECT_GT(l2(want.params.at(name)), 0.0) << name << " did not move";
    ++biases;
  }
  EXPECT_EQ(biases, sharded.model.n_layer - sharded.model.first_dense);
}

// A run's losses and final weights from step `first` to `last`, resumed from `from` (if
// given); saved to `save` (if given) at `last` (with no step run when first == last).
struct Leg {
  std::vector<double> losses;
  std::vector<float> weights;  // every parameter this rank holds, in store order
};
Leg leg(const Config& cfg, int first, int last, const std::string& from, const std::string& save) {
  Grid grid(MPI_COMM_WORLD, cfg.parallel, cfg.source);
  const int T = cfg.train.seq_len;
  auto backend = make_cpu_backend();
  Trainer trainer(cfg, grid, *backend, [T](int64_t f, int n, int32_t* in, int32_t* tgt) { pattern(f, n, in, tgt, T); });
  if (!from.empty()) {
    EXPECT_EQ(trainer.load_checkpoint(from, false), first);
  }
  Leg out;
  for (int s = first; s < last; ++s) out.losses.push_back(trainer.train_step(s).loss);
  if (!save.empty()) trainer.save_checkpoint(save, last);
  trainer.gather_weights();
  for (const auto& p : trainer.params().params())
    out.weights.insert(out.weights.end(), p.value.f32(), p.value.f32() + p.numel());
  return out;
}

// A state saved at any level, resumed at any level, continues exactly as the same state
// saved at any other: checkpoints hold global tensors, and a load puts every element back
// where that level keeps it. (The levels' runs differ in the last bits: "none" and
// "optimizer" add a step's embedding rows to the reduced table, or sum a tied table's copies
// first, the unit levels reduce each copy with its rows in it; "gradients" and "weights" are
// the same sums in the same order.)
TEST(ShardedDataParallel, ACheckpointResumesAtAnyOtherLevelBitForBit) {
  if (world_size() != 2 && world_size() != 4) GTEST_SKIP() << "runs on 2 ranks (dp 2) and 4 (dp 2, pp 2)";
  const GridCase g{2, world_size() / 2, 1};
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "pipetrain_shard_resume";
  if (world_rank() == 0) std::filesystem::create_directories(dir);
  MPI_Barrier(MPI_COMM_WORLD);
  const std::vector<std::string> levels = {"none", "optimizer", "gradients", "weights"};
  const auto config = [&](const std::string& level) { return shard_config(g, "1f1b", level); };
  const auto file = [&](const std::string& name) { return (dir / (name + ".h5")).string(); };
  leg(config("none"), 0, 2, "", file("start"));
  for (const std::string& level : levels) leg(config(level), 2, 2, file("start"), file("saved-" + level));
  for (const std::string& resumed : levels) {
    const Leg want = leg(config(resumed), 2, 4, file("start"), "");
    for (const std::string& saved : levels) {
      SCOPED_TRACE("saved at " + saved + ", resumed at " + resumed);
      const Leg got = leg(config(resumed), 2, 4, file("saved-" + saved), "");
      EXPECT_EQ(got.losses, want.losses);
      EXPECT_TRUE(got.weights == want.weights) << "the final weights differ";
    }
  }
  EXPECT_TRUE(leg(config("gradients"), 2, 4, file("start"), "").weights ==
              leg(config("weights"), 2, 4, file("start"), "").weights);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::filesystem::remove_all(dir);
}

// Under "weights" a rank stores its part of each unit (a dp-th of it) and no whole weights
// between steps; a read outside the program's windows finds no weights.
TEST(ShardedDataParallel, WeightsLiveAsShardsBetweenSteps) {
  if (world_size() != 2) GTEST_SKIP() << "runs on 2 ranks (dp 2)";
  const Config cfg = shard_config({2, 1, 1}, "1f1b", "weights");
  Grid grid(MPI_COMM_WORLD, cfg.parallel, cfg.source);
  const int T = cfg.train.seq_len;
  auto backend = make_cpu_backend();
  Trainer trainer(cfg, grid, *backend, [T](int64_t f, int n, int32_t* in, int32_t* tgt) { pattern(f, n, in, tgt, T); });
  trainer.train_step(0);
  for (const auto& p : trainer.params().params()) {
    EXPECT_FALSE(p.value.defined()) << p.name << " is whole between steps";
    EXPECT_FALSE(p.grad.defined()) << p.name << "'s gradient is whole between steps";
  }
}

}  // namespace
}  // namespace pipetrain
