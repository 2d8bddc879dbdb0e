// Named schedule generators (the LAMMPS "style" pattern).
// Exports: ScheduleParams, ScheduleGenerator, register_schedule, make_schedule,
// list_schedules. Built-ins (gpipe, 1f1b, interleaved-1f1b, looped-bfs, zb-h1, zbv,
// dualpipev) are registered in one table in src/schedule/registry.cpp: adding one is a
// generator function (see builtins.hpp) plus one line there, or a register_schedule call
// at run time.
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "pipetrain/schedule/schedule.hpp"

namespace pipetrain {

struct ScheduleParams {
  int ranks = 1;
  int stages_per_rank = 1;  // virtual stages per rank (1 = plain pipeline)
  int microbatches = 1;
};

// Builds a schedule, or throws pipetrain::Error saying why it cannot take `params`.
using ScheduleGenerator = std::function<Schedule(const ScheduleParams&)>;

// Adds (or, for a name already known, replaces) a named generator.
void register_schedule(std::string name, std::string description, ScheduleGenerator gen);

// Runs the generator registered as `name`. Throws pipetrain::Error for an unknown name
// (listing the known ones), for non-positive parameters, and for parameters the schedule
// cannot take (the generator says why). The result is not validated: call validate().
Schedule make_schedule(const std::string& name, const ScheduleParams& params);

// (name, description) of every registered schedule, built-ins first, in registration order.
std::vector<std::pair<std::string, std::string>> list_schedules();

}  // namespace pipetrain
