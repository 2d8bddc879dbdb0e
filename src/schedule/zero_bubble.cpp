// zb_h1_schedule and zbv_schedule (builtins.hpp): the zero-bubble schedules of Qi et al.
// ("Zero Bubble Pipeline Parallelism"), under the paper's cost model F = I = W per stage.
//   zb-h1: one stage per rank. 1F1B's warm-up (min(p-r-1, m) forwards), then for each
//          microbatch j: F (while forwards remain), I(j), and W(j - r): rank r keeps r
//          weight-gradient steps deferred, and they fill the cool-down bubbles, so every
//          rank ends at the same time. For m >= p the bubble per rank is
//          (p-1)(F + I - W), a third of 1F1B's (p-1)(F+B) when F = I = W. Every rank
//          stashes at most min(p, m) microbatches (a deferred W keeps its stash): the
//          1F1B peak, which 1F1B reaches on rank 0.
//   zbv:   V placement, 2 stages per rank (rank r holds stages r and 2p-1-r, so the first
//          and last stage share rank 0), built with the greedy list scheduler: I first
//          (critical path), then F while fewer than 2p half-size stashes are held (1F1B's
//          p full ones), then W to fill idle time; older microbatches and later stages
//          first.
#include <algorithm>

#include "pipetrain/core/error.hpp"
#include "pipetrain/schedule/builtins.hpp"
#include "pipetrain/schedule/list_scheduler.hpp"

namespace pipetrain {
namespace {

int kind_rank(Op op) { return op == Op::I || op == Op::B ? 0 : op == Op::F ? 1 : 2; }

}  // namespace

Schedule zb_h1_schedule(const ScheduleParams& p) {
  if (p.stages_per_rank != 1)
    fail("zb-h1 takes 1 stage per rank (got {}); use zbv for 2 stages per rank",
         p.stages_per_rank);
  Schedule s = new_schedule("zb-h1", p, false);
  const int m = p.microbatches;
  for (int r = 0; r < p.ranks; ++r) {
    auto& prog = s.per_rank[static_cast<size_t>(r)];
    const int warmup = std::min(p.ranks - r - 1, m);
    int next_w = 0;
    auto weight_lagging = [&](int j) {  // W of microbatch j - r (r W's stay deferred)
      if (j - r >= 0) prog.push_back({Op::W, next_w++, r});
    };
    for (int i = 0; i < warmup; ++i) prog.push_back({Op::F, i, r});
    for (int j = 0; j < m; ++j) {
      if (warmup + j < m) prog.push_back({Op::F, warmup + j, r});
      prog.push_back({Op::I, j, r});
      weight_lagging(j);
    }
    while (next_w < m) prog.push_back({Op::W, next_w++, r});
  }
  return s;
}

Schedule zbv_schedule(const ScheduleParams& p) {
  if (p.stages_per_rank != 2)
    fail("zbv needs exactly 2 stages per rank (V placement; got {})", p.stages_per_rank);
  ListSchedulerSpec spec;
  spec.base = new_schedule("zbv", p, true);
  spec.inflight_cap.assign(static_cast<size_t>(p.ranks),
                           std::min(2 * p.ranks, 2 * p.microbatches));
  spec.priority = [](int, const Action& a) {
    return std::array<int, 4>{kind_rank(a.op), a.microbatch, -a.stage, 0};
  };
  return list_schedule(std::move(spec));
}

}  // namespace pipetrain
