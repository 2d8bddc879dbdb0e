// The planner's costing of one layout up to (not including) its simulation: the stages'
// split and costs, each pipeline rank's busy time, tail (dp, AdamW, tied pair) and memory.
// Private to src/plan (planner.cpp ranks what this costs). Exports: Built,
// Context, Costed, cost_layout.
#pragma once
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "pipetrain/core/config.hpp"
#include "pipetrain/plan/cluster.hpp"
#include "pipetrain/plan/cost_model.hpp"
#include "pipetrain/plan/memory_estimate.hpp"
#include "pipetrain/plan/planner.hpp"
#include "pipetrain/schedule/program.hpp"
#include "pipetrain/schedule/program_builder.hpp"
#include "pipetrain/schedule/simulate.hpp"

namespace pipetrain {

// A schedule built once per (name, ranks, stages per rank, microbatches) and shared by
// every layout that runs it.
struct Built {
  bool ok = false;
  Schedule schedule;
  std::vector<int> peaks;
  std::vector<std::vector<StashPoint>> stash_points;  // memory_estimate.hpp
  std::unique_ptr<Program> program;        // lowered on first simulation
  // With vocabulary slices, by tp: placed as the trainer places them (vocab_placement_costs),
  // which depends on the slices (pp x tp) and the model, not on the cluster.
  std::map<int, std::unique_ptr<Program>> vocab_programs;
};

// One layout costed up to (not including) its simulation.
struct Costed {
  Layout layout;
  Built* built = nullptr;
  Costs costs;                               // per stage
  double transfer = 0;                       // one activation between stages
  // per pipeline rank, over the step (ep: exposed all-to-alls; cp: the ring's exposed transfers)
  std::vector<double> busy, tp_comm, ep_comm, cp_comm;
  std::vector<double> dp, optimizer, other;  // per pipeline rank, after the program
  RankMemory memory;                         // the rank that holds the most
  std::vector<MemoryInputs> inputs;          // per pipeline rank
  double lower_bound = 0;
};

struct Context {
  const Config& cfg;
  const ClusterSpec& cluster;
  int devices, global_batch;
  double bucket_bytes;
  // The balanced splits found, by (stages, vocabulary parallel, unit costs): layouts that
  // differ in dp, schedule or microbatches share them.
  mutable std::map<std::tuple<int, bool, double, double, double, double>, std::vector<StageUnits>> splits = {};
};

// Costs everything but the timeline. `built` is the layout's schedule.
Costed cost_layout(const Context& cx, Layout l, Built& built);

}  // namespace pipetrain
