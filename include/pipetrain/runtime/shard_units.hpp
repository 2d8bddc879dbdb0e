// The units sharded data parallelism moves (parallel.shard = "gradients" | "weights"), as a
// rank's parameters: plan/shard_plan.hpp's rule applied to the layers a rank built, so the
// program's collectives (placed from the plan's units) and the rank's flat buffers agree. A
// unit is the parameters a layer declares; a tied table (the embedding's, which the output
// layer reads too) is a unit of its own, so its two copies on two pipeline ranks are laid
// out, and sharded, alike; so are a layer's expert-parallel experts (sharded over the ranks
// holding the same experts). A rank's units are numbered per stage as expert_unit says.
// State the optimizer never touches (a router's selection bias, moved alike on every rank)
// belongs to no unit: every rank keeps it whole.
#pragma once
#include <map>
#include <vector>

#include "pipetrain/core/config.hpp"
#include "pipetrain/model/stage.hpp"
#include "pipetrain/schedule/shard_pass.hpp"

namespace pipetrain {

struct RankUnits {
  std::map<int, std::vector<std::vector<UnitRef>>> layers;  // [stage][layer] -> the units it touches
  std::vector<UnitRef> units;                               // in their parameters' declaration order
  std::vector<std::vector<Parameter*>> params;              // per unit, in declaration order
};

// Numbers the units of one rank's stages and sets each parameter's Parameter::unit (the
// index into RankUnits::units). `tied`: the model's embedding table is also its output layer.
RankUnits number_units(const std::map<int, ModelStage*>& stages, bool tied);

// Fails unless `numbered` (this rank's) touches the units `planned` (the plan's rule,
// plan/shard_plan.hpp) says, layer by layer.
void check_units(const RankUnits& numbered, const std::map<int, std::vector<std::vector<UnitRef>>>& planned);

}  // namespace pipetrain
