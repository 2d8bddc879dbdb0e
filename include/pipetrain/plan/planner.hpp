// `pipetrain plan`: every layout of a model on a cluster (grid, with context parallelism
// where sequences are long; schedule with its virtual stages, microbatches, recomputation,
// ZeRO-1, precision, vocabulary parallelism where parallel.vocab_parallel is "auto"), the
// ones that do not fit in a device's memory dropped, the rest ranked by a simulated step
// (the lowered program of the schedule, timed by the cost model, plus each rank's tail: dp
// reduction, tied embedding, AdamW). Exports: PlanOptions, Layout, Prediction, PlanResult, plan, predict, describe,
// layout_overrides, peak_stashes, kMinRingChunk.
#pragma once
#include <string>
#include <vector>

#include "pipetrain/core/config.hpp"
#include "pipetrain/model/layer.hpp"
#include "pipetrain/plan/cluster.hpp"
#include "pipetrain/plan/cost_model.hpp"
#include "pipetrain/schedule/schedule.hpp"

namespace pipetrain {

struct PlanOptions {
  int nodes = 0;         // 0: the cluster file's
  int devices = 0;       // 0: nodes x devices_per_node (--plan auto: the ranks launched)
  int global_batch = 0;  // 0: train.global_batch
  int top = 5;
  std::vector<std::string> precisions;  // empty: every precision the device has a peak for
  std::vector<std::string> schedules;   // empty: every registered schedule
  std::vector<std::string> recompute{"none", "selective", "full"};
  std::vector<bool> zero1{false, true};
  // parallel.shard levels to try; empty: those of `zero1` (none, optimizer), with ZeRO-1 on
  // "gradients" and "weights" too where the device runs them (CPUs), and the config's
  // parallel.shard where it asks for more.
  std::vector<ShardLevel> shard;
  std::vector<int> only_tp, only_pp;  // empty: any that divides
  std::vector<int> only_ep;           // empty: any ep_options allows (a model with experts)
  std::vector<int> only_cp;           // empty: any cp_options allows (sequences of kMinRingChunk x 2 tokens on)
  std::vector<int> only_virtual;      // empty: 1, 2, 4, ... up to max_virtual_stages
  int max_virtual_stages = 4;  // interleaved and looped schedules try 2, 4, ... up to this
  double dp_bucket_mb = 25;
};

// Context parallelism is enumerated where each rank keeps at least this many tokens of a
// sequence (Megatron's guidance: cp for sequences of 8k and more). Shorter sequences fit with
// tp, sequence parallelism and recomputation, and a ring step's blocks are then too small to
// hide their transfers between nodes; leaving them out keeps the search as it was for them.
inline constexpr int kMinRingChunk = 4096;

// A candidate run: its grid (ep enumerated where the model has experts, cp where
// sequences are long) and the choices laid over it.
struct Layout : GridShape {
  int virtual_stages = 1;
  std::string schedule = "1f1b";
  int microbatches = 1;      // per replica
  int microbatch_size = 1;   // sequences
  Recompute recompute = Recompute::None;
  bool zero1 = false;                   // the AdamW moments sharded over the replicas (every shard level)
  ShardLevel shard = ShardLevel::None;  // parallel.shard
  // Under "weights": parallel.shard_reuse = "keep" (each unit gathered once a step) or
  // "regather", and parallel.shard_prefetch (layers of work a gather is posted ahead).
  bool shard_keep = false;
  int shard_prefetch = 1;
  int shard_group = 0;  // parallel.shard_group (the planner's own layouts: 0, every replica)
  std::string precision = "fp32";
  bool vocab_parallel = false;           // parallel.vocab_parallel: the vocabulary sliced over pp x tp ranks
  // parallel.sequence_parallel: on wherever tp > 1 divides the sequence (the same bytes as
  // the all-reduces it replaces, a tp-th of the activations between them: never worse),
  // unless the config sets it false.
  bool sequence_parallel = false;
  std::vector<double> blocks_per_stage;  // the auto split under the cost model (x.5: half blocks)
};

struct Prediction {
  double step_s = 0, tokens_per_s = 0, flops_per_device = 0, mfu = 0;
  RankMemory memory;  // of the rank that holds the most
  // Where the critical rank's step goes (they add up to step_s).
  double compute_s = 0, tp_comm_s = 0, bubble_s = 0, dp_s = 0, optimizer_s = 0, other_s = 0;
  double ep_comm_s = 0;   // the expert all-to-alls' time not hidden in F&B pairs
  double cp_comm_s = 0;   // the context-parallel ring's transfers not hidden behind its blocks
  int critical_rank = 0;  // pipeline rank
};

struct PlanResult {
  std::vector<std::pair<Layout, Prediction>> ranked;  // best first, at most options.top
  int devices = 0, global_batch = 0;
  long long candidates = 0, pruned_memory = 0, simulated = 0;
  double usable_memory = 0;  // a device's memory less the reserve
  Layout smallest;           // the layout needing the least memory (when none fits)
  double smallest_memory = 0;
  std::string reason;        // why the first beats the second
};

// Throws pipetrain::Error (one line) when no grid divides the devices and the batch, or
// when nothing fits (naming the smallest memory that would and its layout).
PlanResult plan(const Config& cfg, const ClusterSpec& cluster, const PlanOptions& options);

// The prediction for one layout (its blocks_per_stage empty: the auto split is computed).
Prediction predict(const Config& cfg, const ClusterSpec& cluster, Layout& layout, int global_batch = 0);

// "dp 2 x pp 2 x tp 1, 1f1b, 8 x 2 sequences, recompute none, ZeRO-1 off, fp32".
std::string describe(const Layout& l);
// The --set overrides that run a layout ("parallel.dp=2", ...).
std::vector<std::string> layout_overrides(const Layout& l);
// The layout a config runs, as the planner describes layouts (blocks_per_stage empty).
Layout layout_of(const Config& cfg);

// The keys a plan chooses (those of layout_overrides) set to a layout any batch allows,
// followed by `overrides`: what `plan`, `train --plan auto` and `check --plan auto` load a
// config with, so that the file's own grid and microbatches are not checked against a
// batch or a rank count the planner is about to choose a layout for.
std::vector<std::string> with_planning_layout(const std::vector<std::string>& overrides);

// What `train --plan auto` (and `check --plan auto`) runs on `ranks` devices: the config
// file with `overrides`, under the best layout for `cluster` in its precision (the plan's
// schedule, not a file's). `note` gets " auto (best of N layouts, M pruned for memory...)".
Config planned_config(const std::string& path, const std::vector<std::string>& overrides, const ClusterSpec& cluster,
                      int ranks, std::string* note);

// Per rank: the most (microbatch, stage) stashes alive at once in the schedule's order.
std::vector<int> peak_stashes(const Schedule& s);

}  // namespace pipetrain
