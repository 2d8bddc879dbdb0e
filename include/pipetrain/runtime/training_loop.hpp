// TrainingLoop: a run's step cadence, from its start step to train.steps.
//
// Each step is trained; evaluated every train.eval_every steps and at the last one (when
// validation data is given); measured (peak memory over all ranks, model FLOP/s,
// MFU against log.peak_flops); handed to the sink; and checkpointed every
// checkpoint.every steps and at the end. A stop requested on any rank (by default a
// SIGUSR1/SIGTERM, see stop_signal.hpp) is agreed by all ranks at the step boundary: the
// loop checkpoints and returns. The first steps' measured execution can be recorded as a
// Chrome trace. Collective over the trainer's grid; what is printed, and how, is the
// sink's (the CLI's run log).
#pragma once
#include <functional>
#include <string>

#include "pipetrain/core/config.hpp"
#include "pipetrain/runtime/stop_signal.hpp"
#include "pipetrain/runtime/trace_writer.hpp"
#include "pipetrain/runtime/trainer.hpp"

namespace pipetrain {

struct StepRecord {
  StepMetrics metrics;
  double val_loss = -1;       // < 0: not evaluated at this step
  double peak_mem_bytes = 0;  // most memory held on any rank so far (Trainer::peak_memory_bytes)
  double least_peak_mem_bytes = 0;  // the smallest of the ranks' peaks (how even the layout is)
  double reserved_mem_bytes = 0;    // most memory any rank holds now, cached included (Trainer::reserved_memory_bytes)
  double flops_per_s = 0;     // model FLOP/s of the step, all ranks together
  double mfu = -1;            // flops_per_s / (log.peak_flops x ranks); < 0: no peak given
  int64_t tokens = 0;         // tokens trained up to and including this step
  bool report = false;        // a log.every step, the last one, or one with a val loss
};

struct LoopOptions {
  double flops_per_token = 0;  // model FLOPs per trained token (forward + backward)
  BatchSource validation;      // the validation set's windows; empty: no evaluation
  std::string trace_dir;       // "": no measured trace; else DIR/trace.json at the end
  int trace_steps = 20;        // how many of the first steps the trace records
  // The stop request of this rank: a signal number, 0 for none; asked once per step.
  std::function<int()> stop_requested = stop_signal_received;
};

struct LoopSink {
  std::function<void(const std::string&)> message;  // a progress line (checkpoints, resume)
  std::function<void(const std::string&)> warning;  // something skipped (an unreadable checkpoint)
  std::function<void(const StepRecord&)> step;      // every step, on every rank
};

struct LoopOutcome {
  int next_step = 0;    // the step a resumed run continues from
  int stop_signal = 0;  // 0: ran to train.steps; else the signal that stopped it
};

class TrainingLoop {
 public:
  TrainingLoop(const Config& cfg, Trainer& trainer, Grid& grid, LoopOptions options, LoopSink sink);
  // Where the run starts: `resume` = "auto" (the newest checkpoint of checkpoint.dir that
  // reads back, or step 0) or a checkpoint file; else `init` (a checkpoint whose weights
  // start a new run), else step 0. Returns the start step.
  int restore(const std::string& resume, const std::string& init);
  LoopOutcome run(int start_step);
  // Writes the checkpoint that continues at `next_step` into checkpoint.dir, points
  // `latest` at it and prunes to checkpoint.keep. `why` goes into the message.
  void save(int next_step, const std::string& why);

 private:
  void tell(const std::string& text) const;
  const Config& cfg_;
  Trainer& trainer_;
  Grid& grid_;
  LoopOptions opt_;
  LoopSink sink_;
};

}  // namespace pipetrain
