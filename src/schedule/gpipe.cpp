// gpipe_schedule (builtins.hpp): GPipe. Every rank runs the forward of all microbatches,
// then their backward, in microbatch order. One stage per rank.
#include "pipetrain/core/error.hpp"
#include "pipetrain/schedule/builtins.hpp"

namespace pipetrain {

Schedule gpipe_schedule(const ScheduleParams& p) {
  if (p.stages_per_rank != 1)
    fail("gpipe takes 1 stage per rank (got {}); use looped-bfs or interleaved-1f1b for "
         "virtual stages",
         p.stages_per_rank);
  Schedule s = new_schedule("gpipe", p, false);
  for (int r = 0; r < p.ranks; ++r) {
    auto& prog = s.per_rank[static_cast<size_t>(r)];
    for (int m = 0; m < p.microbatches; ++m) prog.push_back({Op::F, m, r});
    for (int m = 0; m < p.microbatches; ++m) prog.push_back({Op::B, m, r});
  }
  return s;
}

}  // namespace pipetrain
