// one_f_one_b_schedule (builtins.hpp): non-interleaved 1F1B (PipeDream-flush). Rank r
// runs w = min(p-r-1, m) warm-up forwards, then m-w (forward, backward) pairs, then w
// backwards, so at most min(p-r, m) activations are stashed on it. One stage per rank.
#include <algorithm>

#include "pipetrain/core/error.hpp"
#include "pipetrain/schedule/builtins.hpp"

namespace pipetrain {

Schedule one_f_one_b_schedule(const ScheduleParams& p) {
  if (p.stages_per_rank != 1)
    fail("1f1b takes 1 stage per rank (got {}); use interleaved-1f1b for virtual stages",
         p.stages_per_rank);
  Schedule s = new_schedule("1f1b", p, false);
  const int m = p.microbatches;
  for (int r = 0; r < p.ranks; ++r) {
    auto& prog = s.per_rank[static_cast<size_t>(r)];
    const int warmup = std::min(p.ranks - r - 1, m);
    for (int i = 0; i < warmup; ++i) prog.push_back({Op::F, i, r});
    for (int i = 0; i < m - warmup; ++i) {
      prog.push_back({Op::F, warmup + i, r});
      prog.push_back({Op::B, i, r});
    }
    for (int i = m - warmup; i < m; ++i) prog.push_back({Op::B, i, r});
  }
  return s;
}

}  // namespace pipetrain
