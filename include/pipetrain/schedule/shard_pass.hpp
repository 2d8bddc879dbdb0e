// Sharded data parallelism's collectives as program instructions (parallel.shard).
//
// Under "gradients" every unit's gradient is reduce-scattered over the data-parallel ranks
// once its last weight-gradient work of the step is done (REDUCE_SCATTER_G), each rank keeping
// its shard; under "weights" each rank also stores only its shard of the weights, and a unit's
// weights are all-gathered before work reads them (GATHER_W) and dropped after (FREE_W). A
// unit is one layer's parameters (a tied table that two layers of a rank read is a unit of
// its own). One pass places them all in a lowered program, from the program itself:
//
//   - the work that touches a unit: a compute's layer (F reads the weights; B and I read them
//     and write the gradient; W writes the gradient), in the order the rank runs them (a
//     forward runs its layers first to last, a backward last to first);
//   - weights, per unit: the windows in which they stay gathered — one for the whole step
//     ("keep": 1F1B reuses a stage's weights on every microbatch) or one per run of work
//     ("regather": the least held, each window gathered again) — each gathered `prefetch`
//     layers of work before its first use, so the transfer overlaps that work, and freed after
//     its last; windows closer than that merge;
//   - gradients, per unit: one reduce-scatter after its last gradient work of the step.
//
// An instruction lands inside the compute whose layer it names ("@k"), between computes
// only at an overlapped pair: the pair's halves interleave by data arrival, so a collective
// inside them could be posted in a different order on two data-parallel ranks, which MPI
// and NCCL both forbid; it goes before the pair (a gather) or after it (a free, a
// reduce-scatter). Every data-parallel rank of a pipeline rank runs the same list, so they
// all post the collectives in one order.
//
// validate_shards proves it: every read finds its unit gathered, no gradient is written
// after its reduce-scatter, each unit is reduce-scattered once per step, nothing stays
// gathered at the end; and it returns each rank's most gathered weights and open gradients
// at once (the working set the memory estimate counts).
// Exports: kScattersInFlight, UnitRef, expert_unit, ShardUnits, uniform_units, ShardPlacement, place_shard_collectives,
// validate_shards.
#pragma once
#include <compare>
#include <cstdint>
#include <map>
#include <vector>

#include "pipetrain/schedule/program.hpp"
#include "pipetrain/schedule/schedule.hpp"

namespace pipetrain {

// The reduce-scatters a rank keeps in flight at most: a unit's whole gradient (and the
// transport's scratch, twice the message under MPI's libnbc) stays until its reduce-scatter
// completes, so the runtime waits for the oldest beyond these, and the memory estimate counts
// them beside the program's open gradients (ShardPeak::largest).
inline constexpr int kScattersInFlight = 1;

struct UnitRef {
  int stage = 0, unit = 0;
  auto operator<=>(const UnitRef&) const = default;
};

// How a rank numbers a stage's units (plan/shard_plan.hpp, runtime/shard_units.hpp): layer k's
// parameters are unit k, a tied table unit `layers`, and layer k's expert-parallel experts
// (sharded over the ranks holding the same experts) unit layers + 1 + k.
inline UnitRef expert_unit(int stage, int layers, int k) { return {stage, layers + 1 + k}; }

// What each rank's layers touch: per rank, per stage it holds, per layer, the units the
// layer reads and whose gradient it writes (its own and, for a tied table's second user,
// the table's), and each unit's elements on one rank before sharding (0 for a unit one rank
// of its group holds alone: it is used in place, never whole beside its part).
struct ShardUnits {
  std::vector<std::map<int, std::vector<std::vector<UnitRef>>>> layers;  // [rank][stage][layer]
  std::vector<std::map<UnitRef, int64_t>> elems;                         // [rank][unit]
};

// Model-free units (`pipetrain schedule --shard`, the tests): every stage `layers` layers,
// layer k touching its unit k of one element.
ShardUnits uniform_units(const Schedule& s, int layers);

struct ShardPlacement {
  bool weights = false;    // GATHER_W / FREE_W ("weights")
  bool gradients = false;  // REDUCE_SCATTER_G ("gradients" and "weights")
  int prefetch = 1;        // layers of work between a gather's post and its first use
  bool keep = false;       // one window per unit per step; false: one per run of work
  bool any() const { return weights || gradients; }
};

// The program with the shard collectives placed (unchanged when placement.any() is false).
// Throws pipetrain::Error when `units` does not describe the program's ranks and stages.
Program place_shard_collectives(Program p, const ShardUnits& units, const ShardPlacement& placement);

// Per rank, the most elements of gathered weights and of open gradients held at once (each
// at its own most). Throws pipetrain::Error naming the rank, the position and the instruction that breaks a rule.
std::vector<ShardPeak> validate_shards(const Program& p, const ShardUnits& units, const ShardPlacement& placement);

}  // namespace pipetrain
