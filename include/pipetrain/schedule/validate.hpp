// Schedule validation. Exports: validate.
#pragma once
#include "pipetrain/schedule/schedule.hpp"

namespace pipetrain {

// Proves, before any rank runs, that the schedule is executable; otherwise throws
// pipetrain::Error with a one-line message naming the rank, the action and the problem:
//  - stage_to_rank / per_rank sizes and ranges, action stage and microbatch ranges;
//  - each (microbatch, stage) has exactly one F and either one B or one I + one W, all on
//    the rank that owns the stage (missing, duplicate, wrong rank, W without I, ...);
//  - each rank's order respects its own dependencies (F before B/I, I before W, and
//    F(m, s) before F(m, s+1) when both stages share the rank, ...);
//  - then, on its lowered program (validate_program in program.hpp): all ranks together
//    make progress (buffered sends, computes wait for remote inputs); otherwise
//    "deadlock: rank 0 waits at 1B0 (position 7, compute step 3) for the gradient 2SEND_B0
//    (rank 1); rank 1 waits ...".
void validate(const Schedule& s);

}  // namespace pipetrain
