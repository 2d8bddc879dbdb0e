// PairTurns (pair_turns.hpp): the rules, in the order the header gives them.
#include "pipetrain/runtime/pair_turns.hpp"

namespace pipetrain {

PairTurns::Who PairTurns::next(const PairSide& f, const PairSide& second, bool second_input_here) const {
  if (f.done && second.done) return Neither;
  Who who = First;
  if (last_ != Neither) who = rules_.f_leads && !rules_.fixed_turns ? First : (last_ == First ? Second : First);
  if ((who == First ? f : second).done) who = who == First ? Second : First;
  if (rules_.fixed_turns) return who;
  auto can_go = [&](Who w) {
    const PairSide& s = w == First ? f : second;
    if (s.done || s.in_flight) return false;
    if (w == First || f.done) return true;
    return (second.steps > 0 || second_input_here) && (!rules_.second_behind || second.steps < f.steps);
  };
  if (can_go(who)) return who;
  const Who other = who == First ? Second : First;
  return can_go(other) ? other : Neither;
}

}  // namespace pipetrain
