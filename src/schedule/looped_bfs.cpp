// looped_bfs_schedule (builtins.hpp): looped BFS (breadth-first pipeline). Loop
// placement with v stages per rank; each rank runs the forward of all microbatches on
// its first local stage, then on the next, ...; then the backward of all microbatches on
// its last local stage, then the one before, ... (microbatches in order).
#include "pipetrain/schedule/builtins.hpp"

namespace pipetrain {

Schedule looped_bfs_schedule(const ScheduleParams& p) {
  Schedule s = new_schedule("looped-bfs", p, false);
  for (int r = 0; r < p.ranks; ++r) {
    auto& prog = s.per_rank[static_cast<size_t>(r)];
    for (int c = 0; c < p.stages_per_rank; ++c)
      for (int m = 0; m < p.microbatches; ++m) prog.push_back({Op::F, m, c * p.ranks + r});
    for (int c = p.stages_per_rank - 1; c >= 0; --c)
      for (int m = 0; m < p.microbatches; ++m) prog.push_back({Op::B, m, c * p.ranks + r});
  }
  return s;
}

}  // namespace pipetrain
