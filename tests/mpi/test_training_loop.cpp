// TrainingLoop without the CLI: the evaluation, report and checkpoint cadences; a stop
// requested on one rank stops every rank after the same step with a checkpoint; and a
// run resumed from it continues to exactly the losses of the uninterrupted run.
#include <gtest/gtest.h>
#include <mpi.h>

#include <csignal>
#include <unistd.h>

#include <filesystem>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/io/checkpoint.hpp"
#include "pipetrain/runtime/training_loop.hpp"
#include "pipetrain/topology/grid.hpp"
#include "mpi/mpi_fixtures.hpp"

namespace pipetrain {
namespace {

using namespace testing;

// A directory every rank agrees on (rank 0's pid), emptied first.
std::string shared_dir(const std::string& tag) {
  int pid = static_cast<int>(::getpid());
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  const auto dir = std::filesystem::temp_directory_path() / ("pipetrain-loop-" + std::to_string(pid) + "-" + tag);
  if (world_rank() == 0) std::filesystem::remove_all(dir);
  MPI_Barrier(MPI_COMM_WORLD);
  return dir.string();
}

Config loop_config(const std::string& dir) {
  Config c = tiny_run_config();
  const int n = world_size();
  c.parallel.pp = n % 2 == 0 ? 2 : n;  // 2 stages, or every rank a stage when the count is odd
  c.parallel.dp = n / c.parallel.pp;
  c.train.microbatches = 2;
  c.train.steps = 6;
  c.train.eval_every = 2;
  c.train.eval_batches = 1;
  c.data.val = {"pattern"};
  c.log.every = 3;
  c.checkpoint.dir = dir;
  c.checkpoint.every = 4;
  c.checkpoint.keep = 10;
  return c;
}

struct Recorded {
  std::vector<StepRecord> steps;
  LoopOutcome outcome;
};

// One run of the loop on a fresh trainer: restored as `resume` says, stopped when
// `stop_after` (>= 0) steps have run on the last rank.
Recorded run_loop(const Config& cfg, const std::string& resume, int stop_after = -1) {
  auto backend = make_cpu_backend();
  Grid grid(MPI_COMM_WORLD, cfg.parallel, cfg.source);
  const int T = cfg.train.seq_len;
  Trainer trainer(cfg, grid, *backend, [T](int64_t f, int n, int32_t* in, int32_t* tgt) { pattern(f, n, in, tgt, T); });
  Recorded out;
  LoopOptions o;
  o.flops_per_token = 1000;
  o.validation = [T](int64_t f, int n, int32_t* in, int32_t* tgt) { pattern(f + 1000, n, in, tgt, T); };
  o.stop_requested = [&out, stop_after] {
    const bool last = world_rank() == world_size() - 1;
    return last && static_cast<int>(out.steps.size()) == stop_after ? SIGUSR1 : 0;
  };
  LoopSink sink;
  sink.step = [&](const StepRecord& r) { out.steps.push_back(r); };
  TrainingLoop loop(cfg, trainer, grid, std::move(o), std::move(sink));
  out.outcome = loop.run(loop.restore(resume, ""));
  return out;
}

TEST(TrainingLoop, CadencesStopAndExactResume) {
  const std::string full_dir = shared_dir("full"), stop_dir = shared_dir("stop");
  const Config full_cfg = loop_config(full_dir);
  const Recorded full = run_loop(full_cfg, "");
  ASSERT_EQ(full.steps.size(), 6u);
  EXPECT_EQ(full.outcome.stop_signal, 0);
  EXPECT_EQ(full.outcome.next_step, 6);
  for (int s = 0; s < 6; ++s) {
    const StepRecord& r = full.steps[static_cast<size_t>(s)];
    EXPECT_EQ(r.metrics.step, s);
    EXPECT_EQ(r.val_loss >= 0, s % 2 == 1) << "step " << s;             // eval_every 2 (and the last step)
    EXPECT_EQ(r.report, s % 3 == 0 || s == 5 || s % 2 == 1) << "step " << s;  // log.every 3, last, val
    EXPECT_EQ(r.tokens, (s + 1) * 8 * 8);
    EXPECT_DOUBLE_EQ(r.flops_per_s, r.metrics.tokens_per_s * 1000);
    EXPECT_GT(r.peak_mem_bytes, 0);
    EXPECT_GT(r.least_peak_mem_bytes, 0);
    EXPECT_LE(r.least_peak_mem_bytes, r.peak_mem_bytes);
    EXPECT_GE(r.reserved_mem_bytes, r.peak_mem_bytes);  // every rank holds at least its peak
    EXPECT_LT(r.mfu, 0);  // no log.peak_flops
  }
  // checkpoint.every 4 and the end.
  EXPECT_TRUE(std::filesystem::exists(checkpoint_path(full_dir, 4)));
  EXPECT_TRUE(std::filesystem::exists(checkpoint_path(full_dir, 6)));
  EXPECT_FALSE(std::filesystem::exists(checkpoint_path(full_dir, 2)));

  // The last rank asks to stop after step 1: every rank stops there, with a checkpoint.
  const Config stop_cfg = loop_config(stop_dir);
  const Recorded stopped = run_loop(stop_cfg, "", 2);
  EXPECT_EQ(stopped.steps.size(), 2u);
  EXPECT_EQ(stopped.outcome.stop_signal, SIGUSR1);
  EXPECT_EQ(stopped.outcome.next_step, 2);
  EXPECT_TRUE(std::filesystem::exists(checkpoint_path(stop_dir, 2)));

  // Resumed: the remaining steps reproduce the uninterrupted run bit for bit.
  const Recorded resumed = run_loop(stop_cfg, "auto");
  ASSERT_EQ(resumed.steps.size(), 4u);
  for (size_t k = 0; k < 4; ++k) {
    const StepRecord &a = resumed.steps[k], &b = full.steps[k + 2];
    EXPECT_EQ(a.metrics.step, b.metrics.step);
    EXPECT_EQ(a.metrics.loss, b.metrics.loss) << "step " << b.metrics.step;
    EXPECT_EQ(a.val_loss, b.val_loss) << "step " << b.metrics.step;
  }
  for (int s = 0; s < 2; ++s) EXPECT_EQ(stopped.steps[static_cast<size_t>(s)].metrics.loss, full.steps[static_cast<size_t>(s)].metrics.loss);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) {
    std::filesystem::remove_all(full_dir);
    std::filesystem::remove_all(stop_dir);
  }
}

}  // namespace
}  // namespace pipetrain
