// The short measurement behind parallel.layers_per_stage = "auto": one microbatch's
// forward and backward through an embedding, a block's two halves and the head of this model, on this
// machine's backend, timed on every rank at once (so a node's memory is as busy as in the
// run, where a head's memory-bound passes may slow more than a block's products) and
// combined on world rank 0, which broadcasts the result (every rank must split alike).
#pragma once
#include "pipetrain/backend/backend.hpp"
#include "pipetrain/model/layer.hpp"
#include "pipetrain/model/partition.hpp"
#include "pipetrain/topology/grid.hpp"

namespace pipetrain {

// Seconds of one microbatch through one unit, per action (the fastest of the rounds after a
// warm-up), and the kinds of unit of one model (a block timed as its attention and MLP
// halves), timed on the calling rank; with the median over the rounds of each unit's cost
// against the block's of the same round (a round times them back to back, so a machine
// whose speed drifts over seconds moves both sides of each ratio alike).
struct UnitTimings {
  double forward = 0, backward_input = 0, backward_weight = 0;
  double total() const { return forward + backward_input + backward_weight; }
};
struct MeasuredUnits {
  UnitTimings embedding, block, head;
  double embedding_per_block = 0, head_per_block = 0, attention_share = 0;
};
MeasuredUnits time_units_here(const ModelConfig& model, Backend& backend, int B, int T, DType storage);

// Collective over grid.world(). B x T tokens per microbatch, this rank's tensor-parallel
// shape (measured as if tp = 1 when the layers need peers: ratios are what matter).
UnitCosts measure_unit_costs(const ModelConfig& model, Backend& backend, Grid& grid, int B, int T, DType storage);

}  // namespace pipetrain
