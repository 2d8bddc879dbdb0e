// Every built-in schedule (and a CSV schedule) on pp = world size reproduces the
// single-rank run: per-step losses and final parameters, and each rank's peak of
// stashed activations equals the simulator's prediction.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/runtime/trainer.hpp"
#include "pipetrain/schedule/csv.hpp"
#include "pipetrain/schedule/program_csv.hpp"
#include "pipetrain/schedule/registry.hpp"
#include "pipetrain/schedule/simulate.hpp"
#include "pipetrain/topology/grid.hpp"
#include "mpi/mpi_fixtures.hpp"

namespace pipetrain {
namespace {

using namespace testing;

Config base_config() {
  Config c = testing::tiny_run_config();
  c.model.n_layer = 8;
  c.model.vocab_size = 50;
  c.train.microbatches = 8;
  return c;
}

const RunResult& reference() {
  static RunResult ref = [] {
    Config c = base_config();
    return run(c, MPI_COMM_SELF);
  }();
  return ref;
}

struct Case {
  std::string schedule;
  int virtual_stages;
};

class PipelineMatchesSingleRank : public ::testing::TestWithParam<Case> {};

void expect_matches_reference(const Config& cfg) {
  const RunResult& ref = reference();
  const RunResult got = run(cfg, MPI_COMM_WORLD);
  expect_same_run(got, ref, cfg);
  // Peak stashed activations equal the simulator's prediction.
  const Schedule sched = schedule_from_config(cfg);
  const SimResult sim = simulate(sched, Costs{});
  for (int p : got.peaks) EXPECT_EQ(p, sim.peak_inflight[static_cast<size_t>(world_rank())]);
}

TEST_P(PipelineMatchesSingleRank, LossesAndParameters) {
  const int p = world_size();
  if (p != 2 && p != 4) GTEST_SKIP() << "pipeline suites run on 2 or 4 ranks";
  Config cfg = base_config();
  cfg.parallel.pp = p;
  cfg.parallel.virtual_stages = GetParam().virtual_stages;
  cfg.schedule.name = GetParam().schedule;
  expect_matches_reference(cfg);
}

INSTANTIATE_TEST_SUITE_P(Schedules, PipelineMatchesSingleRank,
                         ::testing::Values(Case{"gpipe", 1}, Case{"1f1b", 1}, Case{"interleaved-1f1b", 2},
                                           Case{"looped-bfs", 2}, Case{"zb-h1", 1}, Case{"zbv", 2},
                                           Case{"dualpipev", 2}),
                         [](const auto& info) {
                           std::string n = info.param.schedule;
                           for (auto& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

// Stages that end after a block's attention half and begin with its MLP half (x.5 in
// parallel.layers_per_stage), on schedules with deferred weight gradients and virtual
// stages, under both recomputation modes and bf16.
TEST(PipelineHalfBlocks, SplitInsideBlocksMatchesSingleRank) {
  const int p = world_size();
  if (p != 2 && p != 4) GTEST_SKIP() << "pipeline suites run on 2 or 4 ranks";
  struct Split {
    std::string schedule;
    int virtual_stages;
    std::vector<double> on2, on4;  // blocks per stage on 2 and on 4 ranks
    std::string recompute, precision;
  };
  for (const Split& c :
       {Split{"1f1b", 1, {2.5, 5.5}, {1.5, 2.5, 2.5, 1.5}, "none", "fp32"},
        Split{"zb-h1", 1, {5.5, 2.5}, {2.5, 1.5, 1.5, 2.5}, "full", "fp32"},
        Split{"interleaved-1f1b", 2, {1.5, 2.5, 2.5, 1.5}, {0.5, 1.5, 1, 1, 1, 1, 1.5, 0.5}, "selective", "fp32"},
        Split{"1f1b", 1, {3.5, 4.5}, {1.5, 1.5, 2.5, 2.5}, "selective", "bf16"}}) {
    SCOPED_TRACE(::testing::Message() << c.schedule << " " << c.recompute << " " << c.precision);
    Config cfg = base_config();
    cfg.parallel.pp = p;
    cfg.parallel.virtual_stages = c.virtual_stages;
    cfg.parallel.layers_per_stage = p == 2 ? c.on2 : c.on4;
    cfg.schedule.name = c.schedule;
    cfg.train.recompute = c.recompute;
    cfg.train.precision = c.precision;
    if (c.precision == "bf16") {  // against the single rank in bf16, within the layout bound
      Config single = base_config();
      single.train.precision = "bf16";
      // Selective recomputation recomputes attention and GELU from their inputs' bf16 stash,
      // where the forward read them in f32: other rounding points than the single rank's.
      expect_same_run(run(cfg, MPI_COMM_WORLD), run(single, MPI_COMM_SELF), cfg, Bf16Rounding::OtherPoints);
    } else {
      expect_matches_reference(cfg);
    }
  }
}

// runtime.pack_weights on a pipeline: the same steps as the single rank without it, and
// the ranks spend their waits refreshing the copies (none before a first step has used
// them; some in the later steps, where stages wait for their first input).
TEST(PipelinePackedWeights, MatchesSingleRankAndRefreshesWhileWaiting) {
  const int p = world_size();
  if (p != 2 && p != 4) GTEST_SKIP() << "pipeline suites run on 2 or 4 ranks";
  if (!make_cpu_backend()->set_pack_weights(true)) GTEST_SKIP() << "this build or CPU cannot pack weights";
  for (const char* schedule : {"1f1b", "zb-h1"}) {
    SCOPED_TRACE(schedule);
    Config cfg = base_config();
    cfg.parallel.pp = p;
    cfg.schedule.name = schedule;
    cfg.runtime.pack_weights = Toggle::On;
    const RunResult got = run(cfg, MPI_COMM_WORLD);
    expect_same_run(got, reference(), cfg);
    const int steps = static_cast<int>(got.copies_refreshed.size());
    std::vector<int> all(static_cast<size_t>(steps * p));
    MPI_Allgather(got.copies_refreshed.data(), steps, MPI_INT, all.data(), steps, MPI_INT, MPI_COMM_WORLD);
    long later = 0;
    for (int r = 0; r < p; ++r) {
      EXPECT_EQ(all[static_cast<size_t>(r * steps)], 0) << "rank " << r << ", step 0";
      for (int s = 1; s < steps; ++s) later += all[static_cast<size_t>(r * steps + s)];
    }
    EXPECT_GT(later, 0);
  }
}

TEST(PipelineCsv, ScheduleFileMatchesSingleRank) {
  const int p = world_size();
  if (p != 2 && p != 4) GTEST_SKIP() << "pipeline suites run on 2 or 4 ranks";
  Config cfg = base_config();
  cfg.parallel.pp = p;
  cfg.parallel.virtual_stages = 2;
  const std::string path = (std::filesystem::temp_directory_path() / "pipetrain_test_sched.csv").string();
  if (world_rank() == 0) {
    std::ofstream(path) << to_csv(make_schedule("zbv", ScheduleParams{p, 2, cfg.train.microbatches}));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  cfg.schedule.file = path;
  cfg.schedule.placement = "v";
  expect_matches_reference(cfg);
}

// A lowered program written as compute+comms CSV, edited (every receive moved to just
// before the compute that uses it) and read back trains to the same losses.
TEST(PipelineCsv, EditedLoweredProgramMatchesSingleRank) {
  const int p = world_size();
  if (p != 2 && p != 4) GTEST_SKIP() << "pipeline suites run on 2 or 4 ranks";
  Config cfg = base_config();
  cfg.parallel.pp = p;
  cfg.parallel.virtual_stages = 2;
  Program prog = lower(make_schedule("interleaved-1f1b", ScheduleParams{p, 2, cfg.train.microbatches}));
  for (auto& rank : prog.per_rank) {
    std::vector<Instr> recvs, rest;
    for (const auto& i : rank) (i.op == InstrOp::Recv ? recvs : rest).push_back(i);
    rank.clear();
    for (const auto& i : rest) {
      if (i.op == InstrOp::Compute)
        for (const auto& r : recvs) {
          const bool feeds = r.microbatch == i.action.microbatch && r.stage == i.action.stage &&
                             (r.kind == Transfer::Activation ? i.action.op == Op::F : i.action.op != Op::F);
          if (feeds) rank.push_back(r);
        }
      rank.push_back(i);
    }
  }
  ASSERT_NO_THROW(validate_program(prog, 32767));
  const std::string path = (std::filesystem::temp_directory_path() / "pipetrain_test_lowered.csv").string();
  if (world_rank() == 0) std::ofstream(path) << to_comms_csv(prog);
  MPI_Barrier(MPI_COMM_WORLD);
  cfg.schedule.file = path;
  cfg.schedule.placement = "loop";
  expect_matches_reference(cfg);
}

// The tied embedding's copies (first stage, last stage, every dp replica) receive the
// same summed gradient and the same update, so they stay bitwise identical: the last
// stage's early send, the first stage's add and the sum sent back (runtime/
// tied_gradients.hpp) must give both sides the same bits, with dp buckets and ZeRO-1 too.
TEST(TiedEmbedding, EveryCopyStaysBitwiseIdentical) {
  if (world_size() < 2) GTEST_SKIP() << "needs two pipeline ranks";
  struct Layout {
    int dp, pp;
    bool zero1;
  };
  std::vector<Layout> layouts = {{1, world_size(), false}};
  if (world_size() % 2 == 0 && world_size() >= 4) {
    layouts.push_back({2, world_size() / 2, false});
    layouts.push_back({2, world_size() / 2, true});
  }
  for (const Layout& l : layouts)
    for (const char* sched : {"1f1b", "zb-h1"}) {
      SCOPED_TRACE(::testing::Message() << "dp " << l.dp << " pp " << l.pp << " zero1 " << l.zero1 << " " << sched);
      Config cfg = base_config();
      cfg.train.steps = 3;
      cfg.train.grad_clip = 0.05;  // the clipped norm must not count the last stage's copy twice
      cfg.parallel.dp = l.dp;
      cfg.train.microbatches /= l.dp;  // per replica: the same global batch
      cfg.parallel.pp = l.pp;
      cfg.parallel.zero1 = l.zero1;
      cfg.schedule.name = sched;
      const RunResult got = run(cfg, MPI_COMM_WORLD);
      // Each rank's copy of wte as raw bits, hashed (FNV-1a); ranks without one send 0.
      uint64_t h = 0;
      if (auto it = got.params.find("wte"); it != got.params.end()) {
        h = 1469598103934665603ull;
        for (float x : it->second) {
          uint32_t bits;
          std::memcpy(&bits, &x, 4);
          h = (h ^ bits) * 1099511628211ull;
        }
      }
      std::vector<uint64_t> all(static_cast<size_t>(world_size()));
      MPI_Allgather(&h, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
      std::vector<uint64_t> copies;
      for (uint64_t x : all)
        if (x != 0) copies.push_back(x);
      EXPECT_EQ(copies.size(), static_cast<size_t>(2 * l.dp));  // first and last stage of each replica
      for (uint64_t x : copies) EXPECT_EQ(x, copies.front());
    }
}

// Only the copy AdamW updates (the last stage's) holds the table's moments; the first
// stage's copy has none, and the memory estimate counts it so. Under ZeRO-1 every rank's
// moments are its shard of the flat buffer instead.
TEST(TiedEmbedding, OnlyTheUpdatedCopyHoldsMoments) {
  if (world_size() < 2) GTEST_SKIP() << "needs two pipeline ranks";
  Config cfg = base_config();
  cfg.parallel.pp = world_size();
  auto backend = make_cpu_backend();
  Grid grid(MPI_COMM_WORLD, cfg.parallel, cfg.source);
  auto src = [](int64_t, int, int32_t*, int32_t*) {};
  Trainer t(cfg, grid, *backend, src);
  Parameter* wte = t.params().find("wte");
  const int pp = grid.coords().pp;
  int bad = 0;
  if (pp == 0) {
    bad += !wte || wte->m.defined() || wte->v.defined() || t.params().not_updated() != wte->numel();
  } else if (pp == grid.shape().pp - 1) {
    bad += !wte || !wte->m.defined() || !wte->v.defined() || t.params().not_updated() != 0;
  } else {
    bad += wte != nullptr || t.params().not_updated() != 0;
  }
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(bad, 0);
}

TEST(PipelineErrors, UnknownScheduleAndBadMicrobatches) {
  Config cfg = base_config();
  cfg.parallel.pp = world_size();
  cfg.schedule.name = "no-such-schedule";
  auto backend = make_cpu_backend();
  Grid grid(MPI_COMM_WORLD, cfg.parallel, cfg.source);
  auto src = [](int64_t, int, int32_t*, int32_t*) {};
  try {
    Trainer t(cfg, grid, *backend, src);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("schedule.name"), std::string::npos) << e.what();
  }
  if (world_size() > 1) {
    cfg.schedule.name = "interleaved-1f1b";
    cfg.parallel.virtual_stages = 2;
    cfg.train.microbatches = world_size() + 1;  // not a multiple of the ranks
    cfg.train.global_batch = cfg.train.microbatches;
    EXPECT_THROW(Trainer(cfg, grid, *backend, src), Error);
  }
}

}  // namespace
}  // namespace pipetrain
