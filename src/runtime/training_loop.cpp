// TrainingLoop (pipetrain/runtime/training_loop.hpp).
#include "pipetrain/runtime/training_loop.hpp"

#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <csignal>
#include <filesystem>

#include "pipetrain/core/error.hpp"
#include "pipetrain/io/checkpoint.hpp"
#include "pipetrain/io/h5io.hpp"
#include "pipetrain/runtime/resume.hpp"
#include "pipetrain/topology/grid.hpp"

namespace pipetrain {

namespace {

const char* signal_name(int sig) { return sig == SIGTERM ? "SIGTERM" : sig == SIGUSR1 ? "SIGUSR1" : "a signal"; }

}  // namespace

TrainingLoop::TrainingLoop(const Config& cfg, Trainer& trainer, Grid& grid, LoopOptions options, LoopSink sink)
    : cfg_(cfg), trainer_(trainer), grid_(grid), opt_(std::move(options)), sink_(std::move(sink)) {
  // Said at the start, not at the first checkpoint hours later: every rank writes its part
  // of one shared file, which a serial HDF5 cannot do.
  if (!h5io::parallel_hdf5() && grid_.world_size() > 1 && cfg_.checkpoint.every > 0)
    fail("{}: checkpoint.every = {} on {} ranks needs a parallel HDF5, and pipetrain was built with a serial one; "
         "rebuild against a parallel HDF5, or set checkpoint.every = 0",
         cfg_.source, cfg_.checkpoint.every, grid_.world_size());
}

void TrainingLoop::tell(const std::string& text) const {
  if (sink_.message) sink_.message(text);
}

int TrainingLoop::restore(const std::string& resume, const std::string& init) {
  const std::string& dir = cfg_.checkpoint.dir;
  if (resume == "auto") {
    const ResumeResult r = resume_newest(trainer_, grid_, dir, [&](const std::string& path, const std::string& why) {
      if (sink_.warning) sink_.warning(fmt::format("skipping checkpoint {}: {}; trying the previous one", path, why));
    });
    tell(r.path.empty() ? fmt::format("no checkpoint in {}: starting from step 0", dir)
                        : fmt::format("resumed from {} at step {}", r.path, r.step));
    return static_cast<int>(r.step);
  }
  if (!resume.empty()) {
    const auto step = static_cast<int>(trainer_.load_checkpoint(resume, false));
    tell(fmt::format("resumed from {} at step {}", resume, step));
    return step;
  }
  if (!init.empty()) {
    trainer_.load_checkpoint(init, true);
    tell(fmt::format("initialised the weights from {}", init));
  }
  return 0;
}

void TrainingLoop::save(int next_step, const std::string& why) {
  const auto& ck = cfg_.checkpoint;
  const bool root = grid_.world().rank() == 0;
  std::error_code ec;
  if (root) std::filesystem::create_directories(ck.dir, ec);
  MPI_Barrier(grid_.world().comm());  // the directory exists before any rank opens the file
  const std::string path = checkpoint_path(ck.dir, next_step);
  trainer_.save_checkpoint(path, next_step);
  if (root) {
    update_latest(ck.dir, path);
    prune_checkpoints(ck.dir, ck.keep);
    tell(fmt::format("saved checkpoint {} ({})", path, why));
  }
  MPI_Barrier(grid_.world().comm());  // nobody reads `latest` before it names this file
}

LoopOutcome TrainingLoop::run(int start_step) {
  const int steps = cfg_.train.steps;
  const int eval_every = cfg_.train.eval_every;
  const bool tracing = !opt_.trace_dir.empty();
  std::vector<TraceEvent> trace;
  double trace_offset = 0;
  for (int step = start_step; step < steps; ++step) {
    const bool traced = tracing && step < opt_.trace_steps;
    trainer_.set_trace(traced);
    StepRecord rec;
    rec.metrics = trainer_.train_step(step);
    const StepMetrics& m = rec.metrics;
    if (opt_.validation && eval_every > 0 && ((step + 1) % eval_every == 0 || step + 1 == steps))
      rec.val_loss = trainer_.evaluate(opt_.validation, 0, cfg_.train.eval_batches * cfg_.train.global_batch);
    if (traced) {
      // Steps start together (they end in collectives): lay them end to end.
      for (TraceEvent e : trainer_.last_stats().events) {
        e.start_s += trace_offset;
        e.step = step;
        trace.push_back(std::move(e));
      }
      trace_offset += m.step_time_s;
    }
    const double mine = trainer_.peak_memory_bytes();
    // The largest and (negated) the smallest of the ranks' peaks, and the most held.
    double peaks[3] = {mine, -mine, trainer_.reserved_memory_bytes()};
    grid_.world().allreduce_max(peaks, 3);
    rec.peak_mem_bytes = peaks[0], rec.least_peak_mem_bytes = -peaks[1], rec.reserved_mem_bytes = peaks[2];
    rec.flops_per_s = m.tokens_per_s * opt_.flops_per_token;
    if (cfg_.log.peak_flops > 0) rec.mfu = rec.flops_per_s / (cfg_.log.peak_flops * grid_.world_size());
    rec.tokens = static_cast<int64_t>(step + 1) * trainer_.tokens_per_step();
    rec.report = step % cfg_.log.every == 0 || step == steps - 1 || rec.val_loss >= 0;
    if (sink_.step) sink_.step(rec);
    // A stop requested on any rank is agreed here, at the step boundary.
    int stop = opt_.stop_requested ? opt_.stop_requested() : 0;
    MPI_Allreduce(MPI_IN_PLACE, &stop, 1, MPI_INT, MPI_MAX, grid_.world().comm());
    const int next = step + 1;
    if (stop) {
      save(next, signal_name(stop));
      tell(fmt::format("stopping after step {} on {}; resume with --resume auto", step, signal_name(stop)));
      return {next, stop};
    }
    if (cfg_.checkpoint.every > 0 && (next % cfg_.checkpoint.every == 0 || next == steps))
      save(next, "checkpoint.every");
  }
  if (tracing) {
    std::error_code ec;
    if (grid_.world().rank() == 0) std::filesystem::create_directories(opt_.trace_dir, ec);
    const std::string path = (std::filesystem::path(opt_.trace_dir) / "trace.json").string();
    write_chrome_trace(path, trace, grid_.world().comm());
    tell(fmt::format("wrote {} (the first {} steps, all ranks)", path, std::min(steps, opt_.trace_steps)));
  }
  return {std::max(start_step, steps), 0};
}

}  // namespace pipetrain
