// PipelineExecutor: runs one rank's action list (F / B / I / W) for one step.
// Every send and receive is inferred from the schedule's stage -> rank map:
//   F(m, s) consumes F(m, s-1)'s output; B/I(m, s) consumes B/I(m, s+1)'s input
//   gradient. Producer and consumer on the same rank hand the tensor over
//   directly; otherwise the output goes out with a nonblocking send as soon as it
//   exists, and receives are posted a few actions ahead into pooled buffers and
//   waited on at first use. Stashed activations are freed after B, or after W.
//   Message tags come from a TagPlan fixed before the first step.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "pipetrain/comm/communicator.hpp"
#include "pipetrain/model/gpt2.hpp"
#include "pipetrain/schedule/schedule.hpp"
#include "pipetrain/schedule/tag_plan.hpp"

namespace pipetrain {

class Backend;

// Fills the host token and target arrays (B*T each) of microbatch m.
using MicrobatchLoader = std::function<void(int m, int32_t* inputs, int32_t* targets)>;

struct TraceEvent {
  std::string name;  // "1F3" for compute, "wait 1F3" for time blocked on its input
  int rank = 0;
  double start_s = 0, dur_s = 0;
  int step = -1;  // the training step it belongs to (set by the caller)
};

struct ExecutorStats {
  double compute_s = 0;  // inside layer kernels
  double wait_s = 0;     // blocked on receives and, at the end, on sends
  double total_s = 0;
  int peak_stashed = 0;  // most (microbatch, stage) activation stashes alive at once
  double loss_sum = 0;   // sum of token losses computed here (last stage only)
  std::vector<TraceEvent> events;
};

// Callbacks into the trainer while a step runs.
struct ExecutorHooks {
  // Layer `layer` of stage `stage` has accumulated its last weight gradient of the step
  // (its data-parallel reduction may start).
  std::function<void(int stage, int layer)> layer_grads_final;
  // Called after every action (lets nonblocking collectives progress).
  std::function<void()> poll;
  int step = -1;  // for the hang watchdog's report
};

class PipelineExecutor {
 public:
  // stages: the Gpt2Stage of every global stage this rank owns. pp: the pipeline
  // communicator, whose rank numbers are the schedule's ranks. tp: the stage's
  // tensor-parallel peers (may be null).
  PipelineExecutor(const Schedule& schedule, std::map<int, Gpt2Stage*> stages, Communicator& pp,
                   Communicator* tp, Backend& backend, MemoryPool& pool, int d_model);

  // Runs `program` (this rank's actions) over microbatches of B sequences of T tokens,
  // tagging its messages by `tags` (built for the same microbatch count and checked
  // against MPI_TAG_UB before step 0). loss_scale = d(step loss)/d(token loss); 0 runs
  // forward only (evaluation).
  ExecutorStats run(const std::vector<Action>& program, const TagPlan& tags, const MicrobatchLoader& load, int B,
                    int T, float loss_scale, bool trace, const ExecutorHooks& hooks = {});

 private:
  struct Impl;
  const Schedule& schedule_;
  std::map<int, Gpt2Stage*> stages_;
  Communicator& pp_;
  Communicator* tp_;
  Backend& backend_;
  MemoryPool& pool_;
  int d_model_;
};

}  // namespace pipetrain
