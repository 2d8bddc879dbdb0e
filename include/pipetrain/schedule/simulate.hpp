// Timeline simulation of a schedule (pure arithmetic, no MPI).
// Exports: Costs (Costs::from_stage_times), TransferCosts, SimEvent, SimResult, simulate, simulate_program.
#pragma once
#include <array>
#include <string>
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
  // Vocabulary parallelism: one rank's slice per microbatch of EF, OF, OB and EB
  // (VocabOp order), the same on every rank.
  std::array<double, 4> vocab{};
  // Sharded data parallelism (shard_pass.hpp): one unit's weight all-gather and gradient
  // reduce-scatter, each running on the rank's data-parallel link one after the other.
  double gather = 0, scatter = 0;
  double of(Op op) const;
  double of(const Action& a) const;
  // Per-stage costs from each stage's forward + backward time per microbatch: F a third
  // of it, B the rest, and I and W a third each (the proportions of the defaults).
  static Costs from_stage_times(const std::vector<double>& forward_backward);
};

struct SimEvent {
  Action action;
  int rank = 0;
  double start = 0, end = 0;
  std::string vocab;  // a vocabulary slice ("OF3") or a shard collective ("GATHER_W0.1"); empty: the action
  std::string name() const { return vocab.empty() ? to_string(action) : vocab; }
  char category() const { return vocab.empty() ? op_char(action.op) : 'V'; }
};

struct SimResult {
  double makespan = 0;
  double bubble_fraction = 0;     // 1 - sum(busy) / (ranks * makespan)
  std::vector<double> busy;       // per rank: total compute time
  std::vector<int> peak_inflight; // per rank: most (microbatch, stage) pairs whose F ran
                                  // and whose B (or W) has not completed
  std::vector<SimEvent> events;   // rank by rank, each in program order
  // Sharded data parallelism: each rank's collectives on its data-parallel link (named
  // "GATHER_W0.1", ...), in the order they ran (simulate_program only).
  std::vector<SimEvent> link_events;
};

// Validates the schedule (throws pipetrain::Error like validate()), lowers it with every
// receive posted at the start and runs the program (simulate_program): an action starts
// at max(rank free, inputs ready), where a cross-rank input is ready `comm` after its
// producer ends. Sends never block.
SimResult simulate(const Schedule& s, const Costs& costs = {});

// What one cross-rank transfer costs: latency + bytes / bandwidth (bandwidth 0: free).
struct TransferCosts {
  double bytes = 0, bandwidth = 0, latency = 0;
  double time() const { return latency + (bandwidth > 0 ? bytes / bandwidth : 0.0); }
};

struct Program;
// Runs a validated lowered program: a compute starts at max(rank free, input ready);
// SEND, RECV and MOVE take no rank time; a transfer moves once both its SEND has been
// issued and its RECV posted (rendezvous) and takes transfer.time() — so where the
// lowering posts receives shows in the result. costs.comm is ignored (see transfer).
// Shard collectives occupy the rank's data-parallel link in the order they are posted; a
// compute's layer k waits for the gather of its stage's unit k (a compute runs its layers
// for equal parts of its time), and the step ends when the link is done.
SimResult simulate_program(const Program& p, const Costs& costs, const TransferCosts& transfer = {});

}  // namespace pipetrain
