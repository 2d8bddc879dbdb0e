// How overlapped F&B pairs run (schedule/pair_rule.hpp).
#include "pipetrain/schedule/pair_rule.hpp"

namespace pipetrain {

PairRule pair_rule(int tp, int ep, bool vocab_parallel, bool overlap, bool ordered_exchanges) {
  PairRule r;
  r.overlap = overlap;
  r.free_turns = tp <= 1 && !(ep > 1 && ordered_exchanges);
  r.defer_weights = overlap && ep > 1 && !vocab_parallel && r.free_turns;
  return r;
}

}  // namespace pipetrain
