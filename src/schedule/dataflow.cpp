// Dependencies, same-rank order check and the all-ranks dataflow execution of
// pipetrain/schedule/dataflow.hpp (shared by validate() and simulate()).
#include "pipetrain/schedule/dataflow.hpp"

#include <fmt/format.h>

#include <algorithm>

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

namespace {

[[noreturn]] void report_deadlock(const Schedule& s, const ActionTable& t,
                                  const std::vector<size_t>& next) {
  std::string msg = "deadlock:";
  bool first = true;
  for (int r = 0; r < s.num_ranks; ++r) {
    const auto& prog = s.per_rank[static_cast<size_t>(r)];
    const size_t pos = next[static_cast<size_t>(r)];
    if (pos >= prog.size()) continue;
    std::string waits;
    for (const auto& d : dependencies(s, t, prog[pos])) {
      const Slot& p = t.at(d.producer.op, d.producer.microbatch, d.producer.stage);
      if (p.pos >= static_cast<int>(next[static_cast<size_t>(p.rank)])) {
        const char* noun = d.producer.op == Op::F ? "activation" : "gradient";
        if (d.producer.op != Op::F && prog[pos].op == Op::W) noun = "input gradient";
        waits += fmt::format("{}the {} of {} (rank {})", waits.empty() ? "" : " and ", noun,
                             to_string(d.producer), p.rank);
      }
    }
    msg += fmt::format("{} rank {} waits at {} for {}", first ? "" : ";", r, to_string(prog[pos]),
                       waits);
    first = false;
  }
  throw Error(msg);
}

}  // namespace

Timeline run_dataflow(const Schedule& s, const ActionTable& t, const Costs& costs) {
  const auto R = static_cast<size_t>(s.num_ranks);
  Timeline tl;
  tl.start.resize(R);
  tl.end.resize(R);
  for (size_t r = 0; r < R; ++r) {
    tl.start[r].assign(s.per_rank[r].size(), 0.0);
    tl.end[r].assign(s.per_rank[r].size(), 0.0);
  }
  std::vector<size_t> next(R, 0);
  std::vector<double> free_at(R, 0.0);
  size_t remaining = 0;
  for (const auto& prog : s.per_rank) remaining += prog.size();
  while (remaining > 0) {
    bool progressed = false;
    for (size_t r = 0; r < R; ++r) {
      const auto& prog = s.per_rank[r];
      while (next[r] < prog.size()) {
        const Action& a = prog[next[r]];
        double ready = free_at[r];
        bool blocked = false;
        for (const auto& d : dependencies(s, t, a)) {
          const Slot& p = t.at(d.producer.op, d.producer.microbatch, d.producer.stage);
          const auto pr = static_cast<size_t>(p.rank), pp = static_cast<size_t>(p.pos);
          if (pp >= next[pr]) {
            blocked = true;
            break;
          }
          ready = std::max(ready, tl.end[pr][pp] + (pr == r ? 0.0 : costs.comm));
        }
        if (blocked) break;
        tl.start[r][next[r]] = ready;
        tl.end[r][next[r]] = ready + costs.of(a);
        free_at[r] = tl.end[r][next[r]];
        ++next[r];
        --remaining;
        progressed = true;
      }
    }
    if (!progressed) report_deadlock(s, t, next);
  }
  return tl;
}

}  // namespace pipetrain
