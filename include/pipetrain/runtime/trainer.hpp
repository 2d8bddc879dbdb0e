// Trainer: one rank's part of a training run on the dp x pp x tp grid. Builds the
// stages this rank owns (from the schedule's stage -> rank map), runs each step's
// action list through the PipelineExecutor, then reduces gradients (tied embedding
// between first and last stage, data-parallel replicas), clips by the global norm
// and applies AdamW. A single rank is the 1 x 1 x 1 grid with a one-stage schedule.
#pragma once
#include <concepts>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "pipetrain/core/config.hpp"
#include "pipetrain/core/memory_pool.hpp"
#include "pipetrain/model/moe_stats.hpp"
#include "pipetrain/model/partition.hpp"
#include "pipetrain/model/stage.hpp"
#include "pipetrain/model/vocab_slice.hpp"
#include "pipetrain/plan/cost_model.hpp"
#include "pipetrain/plan/product_choice.hpp"
#include "pipetrain/runtime/dp_reducer.hpp"
#include "pipetrain/runtime/executor.hpp"
#include "pipetrain/runtime/gradient_sync.hpp"
#include "pipetrain/runtime/optimizer.hpp"
#include "pipetrain/runtime/resolve_run_plan.hpp"
#include "pipetrain/runtime/shard_units.hpp"
#include "pipetrain/runtime/tied_gradients.hpp"
#include "pipetrain/schedule/program_builder.hpp"
#include "pipetrain/schedule/schedule.hpp"
#include "pipetrain/topology/device_comms.hpp"
#include "pipetrain/topology/grid.hpp"

namespace pipetrain {

class Backend;

// Where a step's samples come from. load fills inputs, targets and positions (count x
// seq_len int32 each, host memory; any pointer may be null) for global samples first ..
// first+count-1. A plain source (any callable taking the first three and inputs, targets)
// has every target count and positions 0 .. seq_len-1; a packed one (data.pack_documents,
// core/documents.hpp) gives the positions, which every pipeline stage then loads, and
// counts the targets, which the step's loss is averaged over.
struct BatchSource {
  using Load = std::function<void(int64_t first, int count, int32_t* inputs, int32_t* targets, int32_t* positions)>;
  Load load;
  std::function<int64_t(int64_t first, int count)> targets;  // packed only
  BatchSource() = default;
  template <typename F>
  requires std::invocable<F&, int64_t, int, int32_t*, int32_t*> BatchSource(
      F plain)  // NOLINT(google-explicit-constructor): any plain loader is a source
      : load([f = std::move(plain)](int64_t first, int count, int32_t* in, int32_t* tgt, int32_t*) mutable {
          f(first, count, in, tgt);
        }) {}
  static BatchSource packed(Load load, std::function<int64_t(int64_t, int)> targets) {
    BatchSource s;
    s.load = std::move(load);
    s.targets = std::move(targets);
    return s;
  }
  bool is_packed() const { return static_cast<bool>(targets); }
  explicit operator bool() const { return static_cast<bool>(load); }
};

struct StepMetrics {
  int step = 0;
  double loss = 0;  // mean token loss of this step's forward pass (before its update)
  double lr = 0;
  double grad_norm = 0;  // before clipping
  double step_time_s = 0;
  double tokens_per_s = 0;
  double bubble_fraction = 0;  // mean idle share of the step over all ranks
  int peak_stashed = 0;        // this rank's most simultaneous activation stashes
  double pp_bytes_sent = 0;    // pipeline bytes this rank sent (1/tp of each tensor under tp)
  bool skipped = false;        // non-finite loss or gradient with runtime.on_nonfinite = "skip"
  // Where this rank's step went, in order (seconds): the program (every compute and
  // transfer), the gradient reductions left after it, the loss and gradient-norm
  // reductions (they wait for the slowest rank), and the optimizer update.
  struct Phases {
    double program_s = 0, reduce_s = 0, norm_s = 0, optimizer_s = 0;
  } phases;
  // Under parallel.shard = "weights": of program_s, the time layers waited for their units'
  // gathers (what the prefetch did not hide).
  double gather_wait_s = 0;
  // Mixture of experts (model/moe_stats.hpp), over the whole step: the mean auxiliary
  // losses before their coefficients, and each MoE block's busiest expert's rows over the
  // mean (empty, and the losses < 0, in a dense model).
  double moe_load_balance = -1, moe_z = -1;
  std::vector<double> moe_max_load;
  std::vector<double> moe_dropped;  // per MoE layer, the share of choices dropped (model.capacity_factor > 0)
};

class Trainer {
 public:
  // Executes `plan` (resolve_run_plan: the config's "auto"s resolved on this node).
  Trainer(const Config& cfg, RunPlan plan, Grid& grid, Backend& backend, BatchSource source,
          TrainerUse use = TrainerUse::Train);
  // The config's plan, resolved here.
  Trainer(const Config& cfg, Grid& grid, Backend& backend, BatchSource source, TrainerUse use = TrainerUse::Train);
  ~Trainer();
  StepMetrics train_step(int step);
  // Mean loss over `count` samples starting at `first` (split over dp replicas), no update.
  double evaluate(const BatchSource& source, int64_t first, int count);

  ParameterStore& params() { return params_; }
  const RunPlan& plan() const { return plan_; }
  const Schedule& schedule() const { return plan_.schedule; }
  const Program& program() const { return train_program_; }
  const ProgramRecipe& program_recipe() const { return recipe_; }
  MemoryPool& pool() { return *pool_; }
  // This rank's most memory held so far: the pool's high-water mark, the packed weight
  // copies the backend keeps outside the pool (runtime.pack_weights) and the transport's
  // scratch for the gradient reductions at its most (each part at its own most, like the
  // memory estimate's parts).
  double peak_memory_bytes() const;
  // What this rank holds now: the pool's blocks, in use or cached for reuse, the packed
  // weight copies, and the reductions' scratch, which stays in the heap for the next step's
  // (docs/cpu.md, the malloc policy). At least the peak; more where sizes vary (a mixture of
  // experts' exchanges).
  double reserved_memory_bytes() const;
  int64_t tokens_per_step() const;
  int microbatch_size() const { return plan_.layout.microbatch_size; }
  int64_t model_params() const { return model_params_; }  // whole model, tied counted once
  // The split of the model over the stages, and the unit costs it was balanced by
  // (measured for layers_per_stage = "auto" on more than one stage).
  const std::vector<StageUnits>& stage_units() const { return plan_.split; }
  const UnitCosts& unit_costs() const { return plan_.unit_costs; }
  // How this rank's tensors move: "mpi" on the CPU, e.g. "tp nccl, dp (1 rank), pp nccl" on GPUs.
  std::string comms_summary() const { return comms_->summary(); }
  bool progress_thread() const { return progress_ && progress_->running(); }  // the MPI collectives
  // train.recompute as it applies to stage `s` (parallel.recompute_stages).
  Recompute recompute_of(int s) const { return plan_.stage_recompute.at(static_cast<size_t>(s)); }
  const ExecutorStats& last_stats() const { return last_stats_; }
  // runtime.dense_products and runtime.pack_weights as this run resolved them: whether
  // the dense products multiply by packed copies, the paths, and, where "auto" decided,
  // why (for the run header).
  bool packs_weights() const { return plan_.packs_weights(); }
  const DenseChoice& dense_products() const { return plan_.dense; }
  bool vocab_parallel() const { return plan_.layout.vocab_parallel; }         // parallel.vocab_parallel, resolved
  const DataParallelReducer* dp_reducer() const { return sync_->reducer(); }  // dp > 1
  // The last step's fully reduced gradient (over dp replicas and the tied embedding),
  // before clipping, as one flat buffer in this rank's parameter layout (params().grads()
  // order). Collective over the dp communicator under ZeRO-1 (gathers the shards).
  std::vector<float> reduced_gradients();
  // Under parallel.shard = "weights": every unit's whole weights gathered and kept, so each
  // parameter's `value` is readable (after training; collective over the replicas). Else nothing.
  void gather_weights();

  // Collective: writes parameters, AdamW moments and the run's state as of the start of
  // step `next_step` to `path` (see io/checkpoint.hpp).
  void save_checkpoint(const std::string& path, int64_t next_step);
  // Collective: loads a checkpoint written on any grid; returns the step to continue
  // from. weights_only: parameters only (a new run initialised from a checkpoint).
  int64_t load_checkpoint(const std::string& path, bool weights_only);
  void set_trace(bool on) { trace_ = on; }
  // The training data's tokenizer, recorded in checkpoints (for `pipetrain generate`).
  void set_tokenizer(std::string name) { tokenizer_ = std::move(name); }
  // The model stage `s`, when this rank holds it (generation runs every stage on one rank).
  ModelStage& stage(int s) const;

 private:
  // The constructor's parts.
  std::map<int, ModelStage*> build_stages();
  void configure_executor(const Config& cfg, int me);
  int64_t count_model_params();           // the whole model's, summed over the replica's ranks
  void update_selection_biases();         // model.router_bias_rate: from the step's loads
  void expert_metrics(StepMetrics& out);  // the step's routing, summed over the ranks
  // Every tensor of the whole model in canonical order, pointing at this rank's data
  // (under ZeRO-1, the moments: this dp rank's slice of them).
  std::vector<struct CheckpointTensor> checkpoint_tensors(bool moments);

  Config cfg_;
  TrainerUse use_;
  Grid& grid_;
  Backend& backend_;
  BatchSource source_;
  std::shared_ptr<MemoryPool> pool_;
  RunPlan plan_;
  ParameterStore params_;
  std::map<int, std::unique_ptr<ModelStage>> stages_;
  std::unique_ptr<PipelineExecutor> executor_;
  Program train_program_;  // the schedule lowered and validated at construction
  ProgramRecipe recipe_;   // how the step's program, and evaluation's, are built
  Program eval_program_;   // forward only, for evaluation's microbatch count
  const Program& eval_program(int microbatches);
  std::unique_ptr<DeviceComms> comms_;            // tp, dp, pp and the tied pair (first and last stage, if distinct)
  std::unique_ptr<ProgressThread> progress_;      // MPI's progress for the reducer (declared first: outlives it)
  ProgressThread* mpi_progress();
  std::unique_ptr<GradientSync> sync_;  // dp and ZeRO-1, the tied pair: the gradients into the update
  bool zero1() const { return sync_->sharded(); }
  // Tokens of each sequence on this rank: seq_len / parallel.cp (context parallelism).
  int local_seq_len() const { return plan_.local_seq_len(cfg_); }
  // Microbatch m's samples from `source`, this rank's chunks of each under context parallelism.
  MicrobatchLoader loader(const BatchSource& source, int64_t first) const;
  AdamW optimizer_;
  int64_t model_params_ = 0;
  std::unique_ptr<MoeStepStats> moe_stats_;  // the step's routing (mixture-of-experts models)
  std::unique_ptr<VocabSlice> vocab_slice_;  // this rank's rows of the vocabulary, then
  ExecutorStats last_stats_;
  bool trace_ = false;
  std::string tokenizer_;
};

}  // namespace pipetrain
