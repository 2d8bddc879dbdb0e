// Which computation of an overlapped pair (schedule.hpp's Schedule::pairs) goes on next:
// the executor's driver (executor_pairs.cpp) asks after every step, given what each of the
// two is doing; pure, so the rules are tested on their own.
//   - The F starts. After a step the other has the turn, or, in an F&F pair (`f_leads`),
//     the F again: the second fills the F's waits, so the F's output, which the next stage
//     waits for, is about as early as alone.
//   - In an F&F pair of one stage (`second_behind`) the second never gets ahead of the F in
//     steps, so it cannot end first: the head's losses are summed in program order.
//   - Under fixed turns (ranks must post their collectives alike: tp > 1, or NCCL) the turn
//     never depends on timing: the two alternate, and the driver waits for whoever has it.
//   - Otherwise whoever has the turn goes on if it can, else the other if it can, else
//     neither (an exposed wait). The second can start once its input is here or the F has
//     ended: its first step would block on that input, and the F must not wait behind it
//     for a value that may need the F's output first.
// Exports: PairSide, PairRules, PairTurns.
#pragma once
#include <cstddef>

namespace pipetrain {

struct PairSide {
  bool done = false;
  bool in_flight = false;  // paused on an exchange that has not completed
  size_t steps = 0;        // steps taken
};

struct PairRules {
  bool f_leads = false;        // an F&F pair
  bool second_behind = false;  // an F&F pair of one stage
  bool fixed_turns = false;
};

class PairTurns {
 public:
  enum Who { First = 0, Second = 1, Neither = -1 };
  explicit PairTurns(PairRules rules) : rules_(rules) {}
  // The one to step now (under fixed turns the driver first waits for its exchange), or
  // Neither.
  Who next(const PairSide& f, const PairSide& second, bool second_input_here) const;
  void stepped(Who who) { last_ = who; }

 private:
  PairRules rules_;
  Who last_ = Neither;
};

}  // namespace pipetrain
