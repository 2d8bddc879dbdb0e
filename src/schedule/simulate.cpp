// simulate() and Costs::of of pipetrain/schedule/simulate.hpp.
#include "pipetrain/schedule/simulate.hpp"

#include <algorithm>

#include "pipetrain/schedule/dataflow.hpp"

namespace pipetrain {

double Costs::of(Op op) const {
  switch (op) {
    case Op::F: return F;
    case Op::B: return B;
    case Op::I: return I;
    case Op::W: return W;
  }
  return 0;
}

double Costs::of(const Action& a) const {
  if (a.stage >= 0 && static_cast<size_t>(a.stage) < per_stage.size())
    return per_stage[static_cast<size_t>(a.stage)][static_cast<size_t>(a.op)];
  return of(a.op);
}

SimResult simulate(const Schedule& s, const Costs& costs) {
  const ActionTable table(s);
  check_rank_order(s, table);
  const Timeline tl = run_dataflow(s, table, costs);
  SimResult res;
  const auto R = static_cast<size_t>(s.num_ranks);
  res.busy.assign(R, 0.0);
  res.peak_inflight.assign(R, 0);
  for (size_t r = 0; r < R; ++r) {
    const auto& prog = s.per_rank[r];
    // A rank runs its program sequentially, so program order is time order: the stash
    // grows at each F and shrinks when the last backward piece (B or W) completes.
    int inflight = 0;
    for (size_t pos = 0; pos < prog.size(); ++pos) {
      const Action& a = prog[pos];
      if (a.op == Op::F) res.peak_inflight[r] = std::max(res.peak_inflight[r], ++inflight);
      if (a.op == Op::B || a.op == Op::W) --inflight;
      res.busy[r] += tl.end[r][pos] - tl.start[r][pos];
      res.makespan = std::max(res.makespan, tl.end[r][pos]);
      res.events.push_back({a, static_cast<int>(r), tl.start[r][pos], tl.end[r][pos]});
    }
  }
  double total = 0;
  for (double b : res.busy) total += b;
  res.bubble_fraction =
      res.makespan > 0 ? 1.0 - total / (static_cast<double>(R) * res.makespan) : 0.0;
  return res;
}

}  // namespace pipetrain
