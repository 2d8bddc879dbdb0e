// dependencies() and check_rank_order() of pipetrain/schedule/action_table.hpp: the
// same-rank order check validate() makes in the schedule's own terms (steps), before
// the lowered program proves the cross-rank part.
#include <fmt/format.h>

#include "pipetrain/schedule/action_table.hpp"

#include "pipetrain/core/error.hpp"

namespace pipetrain {

std::vector<Dependency> dependencies(const Schedule& s, const ActionTable& t, const Action& a) {
  std::vector<Dependency> deps;
  switch (a.op) {
    case Op::F:
      if (a.stage > 0) deps.push_back({{Op::F, a.microbatch, a.stage - 1}, "activation"});
      break;
    case Op::B:
    case Op::I:
      deps.push_back({{Op::F, a.microbatch, a.stage}, "stashed activation"});
      if (a.stage + 1 < s.num_stages)
        deps.push_back({t.backward_of(a.microbatch, a.stage + 1), "gradient"});
      break;
    case Op::W:
      deps.push_back({{Op::I, a.microbatch, a.stage}, "input-gradient split"});
      break;
  }
  return deps;
}

void check_rank_order(const Schedule& s, const ActionTable& t) {
  for (int r = 0; r < s.num_ranks; ++r) {
    const auto& prog = s.per_rank[static_cast<size_t>(r)];
    for (size_t pos = 0; pos < prog.size(); ++pos) {
      for (const auto& d : dependencies(s, t, prog[pos])) {
        const Slot& p = t.at(d.producer.op, d.producer.microbatch, d.producer.stage);
        if (p.rank == r && p.pos > static_cast<int>(pos))
          fail("rank {}, step {}: {} runs before {} (step {}), which it needs ({})", r, pos + 1,
               to_string(prog[pos]), to_string(d.producer), p.pos + 1, d.what);
      }
    }
  }
}

}  // namespace pipetrain
