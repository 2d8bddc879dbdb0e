// How a program's overlapped F&B pairs run: the executor's rule (runtime/executor_impl.hpp),
// which the memory estimate reads too, decided once. Their halves take fixed turns where
// tensor parallelism's collectives, or expert exchanges that every ep rank must post in one
// order (NCCL's), forbid interleaving freely. With free turns under expert parallelism each
// B's weight gradients wait for the exposed exchange waits, the B's stash freed behind
// them: one more microbatch's stash held.
#pragma once

namespace pipetrain {

struct PairRule {
  bool overlap = true;  // schedule.overlap: the pairs' halves overlap at all
  bool free_turns = true;
  bool defer_weights = false;  // (in a program that has overlapped pairs)
};

// `ordered_exchanges`: the expert exchanges' transport needs one order on every ep rank.
PairRule pair_rule(int tp, int ep, bool vocab_parallel, bool overlap, bool ordered_exchanges);

}  // namespace pipetrain
