// RunPlan: what a run will do, every "auto" of its config resolved once into plain values.
// The Trainer executes one (it decides nothing), the run header and `check` print it, and
// the planner prices the same values. plan_run resolves what follows from the config
// alone; a run adds what it measures on its node (runtime/resolve_run_plan.hpp: the dense
// products' paths, the stage split by measured costs, the packed copies' memory test).
// Exports: RunPlan, plan_run, stage_split, split_stages, schedule_from_config, program_recipe.
#pragma once
#include <string>
#include <vector>

#include "pipetrain/core/config.hpp"
#include "pipetrain/model/partition.hpp"
#include "pipetrain/plan/planner.hpp"
#include "pipetrain/plan/product_choice.hpp"
#include "pipetrain/schedule/program_builder.hpp"
#include "pipetrain/schedule/schedule.hpp"

namespace pipetrain {

struct RunPlan {
  // The grid and how it runs: the schedule's name, microbatches and their size, recompute,
  // ZeRO-1 (on where there are replicas), precision, vocabulary and sequence parallelism.
  Layout layout;
  std::string vocab_reason;                // why the slices are on or off ("auto: ...", for the header)
  Schedule schedule;                       // schedule.name or schedule.file, validated
  std::string comms_csv;                   // a compute+comms schedule file's text (its program runs as written)
  std::vector<Recompute> stage_recompute;  // per stage: train.recompute on parallel.recompute_stages
  std::vector<StageUnits> split;           // each stage's units (split_stages)
  UnitCosts unit_costs;                    // the costs the split balanced
  DenseChoice dense;                       // the dense products' paths (a run's: timed on its node)
  bool pack_all = false;                   // runtime.pack_weights = true

  int local_seq_len(const Config& cfg) const { return cfg.train.seq_len / layout.cp; }  // a rank's tokens
  bool packs_weights() const { return pack_all || !dense.paths.packed.empty(); }
};

// What follows from the config alone (no split yet: split_stages).
RunPlan plan_run(const Config& cfg);
// The split of `stages` stages, one rule for the run and the planner's candidates: `given`
// (parallel.layers_per_stage) where it has an entry per stage, else balanced by `costs`,
// less the tables' under vocabulary parallelism (every rank holds a slice of them).
std::vector<StageUnits> stage_split(const ModelConfig& model, int stages, const std::vector<double>& given,
                                    bool vocab_parallel, const UnitCosts& costs);
// The plan's split (stage_split of the config's stages), and the costs it balanced.
void split_stages(RunPlan& plan, const Config& cfg, const UnitCosts& costs);

// The schedule a config asks for (schedule.name, or schedule.file with
// schedule.placement), for `pp` pipeline ranks; validated. When schedule.file is a
// compute+comms file, its text goes to *comms_csv (the file is read once).
Schedule schedule_from_config(const Config& cfg, std::string* comms_csv = nullptr);
// How a layout's program is built (schedule/program_builder.hpp), for the run and the
// planner's candidates alike: `tag_ub` the pipeline communicator's tag bound; `in_order` its
// transport matches messages in posting order (NCCL); the vocabulary slices placed by FLOP
// ratios (vocab_choice.hpp).
ProgramRecipe program_recipe(const ModelConfig& model, const Layout& l, int stages, int tag_ub, bool in_order);
// The plan's: that of its layout, or a compute+comms schedule file's program as written.
ProgramRecipe program_recipe(const Config& cfg, const RunPlan& plan, int tag_ub, bool in_order);

}  // namespace pipetrain
