// Timeline simulation of a schedule (pure arithmetic, no MPI).
// Exports: Costs, SimEvent, SimResult, simulate.
#pragma once
#include <array>
#include <vector>

#include "pipetrain/schedule/schedule.hpp"

namespace pipetrain {

// Duration of one action on one stage, and the latency added to every cross-rank
// dependency. Defaults: F = I = W = 1, B = I + W = 2, no communication cost.
// per_stage, when given, overrides the uniform costs with measured ones: entry s holds
// {F, B, I, W} of stage s (the runtime's benchmark feeds what it timed).
struct Costs {
  double F = 1, B = 2, I = 1, W = 1;
  double comm = 0;
  std::vector<std::array<double, 4>> per_stage;
  double of(Op op) const;
  double of(const Action& a) const;
};

struct SimEvent {
  Action action;
  int rank = 0;
  double start = 0, end = 0;
};

struct SimResult {
  double makespan = 0;
  double bubble_fraction = 0;     // 1 - sum(busy) / (ranks * makespan)
  std::vector<double> busy;       // per rank: total compute time
  std::vector<int> peak_inflight; // per rank: most (microbatch, stage) pairs whose F ran
                                  // and whose B (or W) has not completed
  std::vector<SimEvent> events;   // rank by rank, each in program order
};

// Validates the schedule (throws pipetrain::Error like validate()), then runs every
// rank's program in order: an action starts at max(rank free, inputs ready), where a
// cross-rank input is ready `comm` after its producer ends. Sends never block.
SimResult simulate(const Schedule& s, const Costs& costs = {});

}  // namespace pipetrain
