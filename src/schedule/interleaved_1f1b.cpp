// interleaved_1f1b_schedule (builtins.hpp): Megatron-LM's interleaved 1F1B. Loop
// placement: rank r holds stages r, r+p, ..., r+(v-1)p. Each rank walks m*v "virtual
// microbatches": groups of p microbatches pass through local stage 0, then 1, ... (the
// backward visits the stages in reverse). Warm-up: (p-r-1)*2 + (v-1)*p forwards (all of
// them when m == p), then one forward / one backward, then the remaining backwards.
// Needs m divisible by p (a group of p microbatches fills the loop).
#include <algorithm>

#include "pipetrain/core/error.hpp"
#include "pipetrain/schedule/builtins.hpp"

namespace pipetrain {
namespace {

// The k-th forward (or backward) of a rank: which microbatch and which local stage.
Action virtual_action(int k, bool forward, int rank, const ScheduleParams& p) {
  const int group = p.ranks * p.stages_per_rank;
  int chunk = (k % group) / p.ranks;
  if (!forward) chunk = p.stages_per_rank - 1 - chunk;
  const int mb = (k / group) * p.ranks + k % p.ranks;
  return {forward ? Op::F : Op::B, mb, chunk * p.ranks + rank};
}

}  // namespace

Schedule interleaved_1f1b_schedule(const ScheduleParams& p) {
  if (p.microbatches % p.ranks != 0)
    fail("interleaved-1f1b needs microbatches divisible by ranks (got {} microbatches, {} "
         "ranks)",
         p.microbatches, p.ranks);
  Schedule s = new_schedule("interleaved-1f1b", p, false);
  const int total = p.microbatches * p.stages_per_rank;
  for (int r = 0; r < p.ranks; ++r) {
    auto& prog = s.per_rank[static_cast<size_t>(r)];
    int warmup = (p.ranks - r - 1) * 2 + (p.stages_per_rank - 1) * p.ranks;
    if (p.microbatches == p.ranks) warmup = total;
    warmup = std::min(warmup, total);
    for (int k = 0; k < warmup; ++k) prog.push_back(virtual_action(k, true, r, p));
    for (int k = 0; k < total - warmup; ++k) {
      prog.push_back(virtual_action(warmup + k, true, r, p));
      prog.push_back(virtual_action(k, false, r, p));
    }
    for (int k = total - warmup; k < total; ++k) prog.push_back(virtual_action(k, false, r, p));
  }
  return s;
}

}  // namespace pipetrain
