// simulate() and Costs::of of pipetrain/schedule/simulate.hpp.
#include "pipetrain/schedule/simulate.hpp"

#include <climits>

#include "pipetrain/schedule/program.hpp"
#include "pipetrain/schedule/validate.hpp"

namespace pipetrain {

Costs Costs::from_stage_times(const std::vector<double>& forward_backward) {
  Costs c;
  for (const double t : forward_backward) c.per_stage.push_back({t / 3, 2 * t / 3, t / 3, t / 3});
  return c;
}

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
  validate(s);
  // Every receive posted at the start: a transfer then costs `comm` after its producer
  // ends, whatever the rank is doing (buffered sends, as simulate() promises).
  const Program p = lower(s, {INT_MAX, INT_MAX});
  return simulate_program(p, costs, TransferCosts{0, 0, costs.comm});
}

}  // namespace pipetrain
