// Sharded data parallelism in a run's plan: the collectives parallel.shard places
// (ShardPlacement) and the units they move on every rank (ShardUnits), from the model, the
// layout and the stage split alone — so the trainer, `check` and the planner build the same
// program (schedule/shard_pass.hpp) and count the same working set. A unit is one layer's
// parameters (a stage_pieces entry: the embedding, a block or a half block, the head), a
// tied table a unit of its own, and so are a layer's expert-parallel experts (ep > 1); a rank
// numbers its units per stage as expert_unit says (the table on the first stage that holds it
// on that rank). The
// runtime numbers the parameters it declares by the same rule (runtime/shard_units.hpp) and
// checks that the two agree.
#pragma once
#include <vector>

#include "pipetrain/core/config.hpp"
#include "pipetrain/model/partition.hpp"
#include "pipetrain/plan/planner.hpp"
#include "pipetrain/schedule/schedule.hpp"
#include "pipetrain/schedule/shard_pass.hpp"

namespace pipetrain {

// What the layout's level places (nothing below "gradients"), with its prefetch and reuse
// (parallel.shard_prefetch and shard_reuse: layout_of).
ShardPlacement shard_placement(const Layout& l);

// Every rank's units of a layout run with schedule `s` and stage split `split`.
ShardUnits shard_units(const ModelConfig& model, const Layout& l, const Schedule& s,
                       const std::vector<StageUnits>& split);

}  // namespace pipetrain
