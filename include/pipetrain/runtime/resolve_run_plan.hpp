// A run's plan on its node (plan/run_plan.hpp): the config's plan, plus what the run
// measures there: the dense products' paths (timed, or read from the times' cache, and
// set on the backend), the stage split by the blocks' measured costs
// (parallel.layers_per_stage = "auto" on more than one stage), and runtime.pack_weights =
// "auto"'s memory test for this rank's copies (every rank keeps its packed shapes or none
// does). The Trainer executes the result.
#pragma once
#include "pipetrain/backend/backend.hpp"
#include "pipetrain/core/config.hpp"
#include "pipetrain/plan/run_plan.hpp"
#include "pipetrain/topology/grid.hpp"

namespace pipetrain {

// What a Trainer is built for. Inference holds the weights alone, for a checkpoint's
// weights to be loaded next (load_checkpoint with weights_only): no gradients, no AdamW
// moments, no random initialisation — generating with a model takes its weights' memory,
// not four times it. Such a trainer runs forward passes only (no train_step, no saving),
// on one rank, without vocabulary slices.
enum class TrainerUse { Train, Inference };

// Collective over grid.world(). Throws pipetrain::Error on a batch that does not split.
RunPlan resolve_run_plan(const Config& cfg, Grid& grid, Backend& backend, TrainerUse use);

}  // namespace pipetrain
