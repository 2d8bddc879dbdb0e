// How GPT-2's units (embedding, blocks, head) are split over pipeline stages: the
// embedding goes with stage 0, the final LayerNorm, LM head and loss with the last stage,
// and the blocks as given by parallel.layers_per_stage or — "auto", the default — so that
// the slowest stage is as fast as it can be under the units' costs (the head of GPT-2 124M
// weighs about five blocks: an even split would idle every stage but the last).
// Exports: StageUnits, UnitCosts, balanced_blocks, partition_gpt2, stage_cost, blocks_per_stage.
#pragma once
#include <vector>

#include "pipetrain/core/config.hpp"

namespace pipetrain {

struct StageUnits {
  int first = 0, last = 0;  // units [first, last): 0 = embedding, 1..L = blocks, L+1 = head
};

// The time of one microbatch's forward and backward through each kind of unit (any unit:
// only ratios matter). The runtime measures them (runtime/unit_costs.hpp).
struct UnitCosts {
  double embedding = 0, block = 1, head = 0;
};

// Blocks per stage (num_stages entries summing to model.n_layer, middle stages >= 1)
// minimising the slowest stage's cost; among equally slow splits, the earliest found
// by a dynamic program over stages (deterministic).
std::vector<int> balanced_blocks(const ModelConfig& model, int num_stages, const UnitCosts& costs);

// The units of every stage: layers_per_stage if given, else balanced_blocks(costs).
std::vector<StageUnits> partition_gpt2(const ModelConfig& model, int num_stages,
                                       const std::vector<int>& layers_per_stage = {}, const UnitCosts& costs = {});

double stage_cost(const ModelConfig& model, const StageUnits& units, const UnitCosts& costs);

// The blocks each stage holds (the inverse of partition_gpt2).
std::vector<int> blocks_per_stage(const ModelConfig& model, const std::vector<StageUnits>& units);

}  // namespace pipetrain
