// A greedy list scheduler over the schedule dependency graph, used to build the
// zero-bubble schedules (zb-h1, zbv). Time advances in events; whenever a rank is free
// it runs its highest-priority ready action. Each stage runs each op kind in microbatch
// order; a rank starts a new forward only while fewer than its cap of (microbatch,
// stage) pairs are stashed (F done, B or W not yet run). Deterministic.
// Exports: ListSchedulerSpec, list_schedule.
#pragma once
#include <array>
#include <functional>
#include <vector>

#include "pipetrain/schedule/schedule.hpp"
#include "pipetrain/schedule/simulate.hpp"

namespace pipetrain {

struct ListSchedulerSpec {
  Schedule base;                  // name, sizes and stage_to_rank; per_rank is filled in
  bool split_backward = true;     // I + W (true) or B (false)
  Costs costs;                    // durations the planner assumes
  std::vector<int> inflight_cap;  // per rank: most stashed (microbatch, stage) pairs
  // Lexicographic priority key of a ready action on `rank`: smallest runs first.
  std::function<std::array<int, 4>(int rank, const Action&)> priority;
};

// Fills base.per_rank. If every rank is stuck only because of its cap, the lowest rank
// with a ready forward runs it anyway (so the planner always finishes).
Schedule list_schedule(ListSchedulerSpec spec);

}  // namespace pipetrain
