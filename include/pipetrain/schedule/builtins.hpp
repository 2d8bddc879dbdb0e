// The built-in schedule generators, registered by name in src/schedule/registry.cpp.
// Exports one generator per schedule (each throws pipetrain::Error, naming the schedule,
// for parameters it cannot take) and the helper new_schedule used to start one.
//
//   gpipe             all F then all B per rank; 1 stage per rank
//   1f1b              warm-up min(p-r-1, m) F, then F/B pairs, then B; 1 stage per rank
//   interleaved-1f1b  Megatron's interleaved 1F1B, loop placement; m divisible by p
//   looped-bfs        loop placement; all F of each local stage in turn, then all B reversed
//   zb-h1             ZB-H1: 1F1B with B split into I + W, W's fill the bubbles
//   zbv               zero-bubble V: V placement, 2 stages per rank, I + W split
//   dualpipev         DeepSeek's DualPipeV order, V placement, 2 stages per rank, m >= 2p
#pragma once
#include <string>

#include "pipetrain/schedule/registry.hpp"
#include "pipetrain/schedule/schedule.hpp"

namespace pipetrain {

Schedule gpipe_schedule(const ScheduleParams& p);
Schedule one_f_one_b_schedule(const ScheduleParams& p);
Schedule interleaved_1f1b_schedule(const ScheduleParams& p);
Schedule looped_bfs_schedule(const ScheduleParams& p);
Schedule zb_h1_schedule(const ScheduleParams& p);
Schedule zbv_schedule(const ScheduleParams& p);
Schedule dualpipev_schedule(const ScheduleParams& p);

// An empty program for every rank with num_stages = ranks * stages_per_rank and the
// given placement ("loop" or "v").
Schedule new_schedule(const std::string& name, const ScheduleParams& p, bool v_shape);

}  // namespace pipetrain
