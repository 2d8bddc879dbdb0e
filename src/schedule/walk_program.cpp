// walk_program() (pipetrain/schedule/program.hpp): the one statement of when a lowered
// program's instruction can run.
#include <map>
#include <set>

#include "pipetrain/schedule/program.hpp"

namespace pipetrain {

std::vector<size_t> walk_program(const Program& p, const std::function<void(int, const Instr&)>& visit) {
  const auto R = static_cast<size_t>(p.num_ranks);
  std::vector<size_t> next(R, 0);
  std::set<ValueKey> sent;
  std::map<std::pair<int, int>, std::set<int>> posts;  // (collective, microbatch) -> the ranks that posted it
  for (bool moved = true; moved;) {
    moved = false;
    for (size_t r = 0; r < R; ++r) {
      const auto& prog = p.per_rank[r];
      for (; next[r] < prog.size(); ++next[r], moved = true) {
        const Instr& in = prog[next[r]];
        Instr v;
        if (in.op == InstrOp::Compute && input_of(in.action, p.num_stages, v) &&
            p.stage_to_rank[static_cast<size_t>(producer_stage(v))] != static_cast<int>(r) && !sent.count(value_key(v)))
          break;  // its input has not been sent yet
        if (collective_input(p, in, v)) {
          const std::set<int>& by = posts[{static_cast<int>(v.coll), v.microbatch}];
          const int root = awaited_post(p, v.coll);
          if (root < 0 ? by.size() < R : !by.count(root)) break;  // a post it needs is not there yet
        }
        if (in.op == InstrOp::Send) sent.insert(value_key(in));
        if (in.op == InstrOp::Coll) posts[{static_cast<int>(in.coll), in.microbatch}].insert(static_cast<int>(r));
        visit(static_cast<int>(r), in);
      }
    }
  }
  return next;
}

}  // namespace pipetrain
