// ActionTable (pipetrain/schedule/action_table.hpp): indexes a schedule's actions and runs
// the structural checks of validate(): sizes, ranges, owner rank, duplicates and that
// every (microbatch, stage) has one F and one B or one I + one W.
#include <fmt/format.h>

#include "pipetrain/core/error.hpp"
#include "pipetrain/schedule/action_table.hpp"

namespace pipetrain {
namespace {

size_t op_index(Op op) { return static_cast<size_t>(op); }

void check_shape(const Schedule& s) {
  const std::string who = s.name.empty() ? std::string("schedule") : "schedule '" + s.name + "'";
  if (s.num_ranks < 1) fail("{}: needs at least one rank (num_ranks = {})", who, s.num_ranks);
  if (s.num_stages < 1) fail("{}: needs at least one stage (num_stages = {})", who, s.num_stages);
  if (s.num_microbatches < 1)
    fail("{}: needs at least one microbatch (num_microbatches = {})", who, s.num_microbatches);
  if (static_cast<int>(s.stage_to_rank.size()) != s.num_stages)
    fail("{}: stage_to_rank has {} entries for {} stages", who, s.stage_to_rank.size(),
         s.num_stages);
  for (int st = 0; st < s.num_stages; ++st) {
    const int r = s.stage_to_rank[static_cast<size_t>(st)];
    if (r < 0 || r >= s.num_ranks)
      fail("{}: stage {} is placed on rank {}, but ranks are 0..{}", who, st, r, s.num_ranks - 1);
  }
  if (static_cast<int>(s.per_rank.size()) != s.num_ranks)
    fail("{}: has programs for {} ranks, but num_ranks = {}", who, s.per_rank.size(), s.num_ranks);
}

}  // namespace

ActionTable::ActionTable(const Schedule& s)
    : num_stages_(s.num_stages), num_microbatches_(s.num_microbatches) {
  check_shape(s);
  // Every (stage, microbatch) runs at least a forward: a schedule with fewer actions than
  // stages x microbatches is incomplete, and refusing it first bounds the table by the
  // schedule's own size.
  size_t actions = 0;
  for (const auto& p : s.per_rank) actions += p.size();
  const double pairs = static_cast<double>(num_stages_) * static_cast<double>(num_microbatches_);
  if (pairs > static_cast<double>(actions))
    fail("{} stages x {} microbatches need at least {:.0f} forwards, but the schedule has only {} actions",
         num_stages_, num_microbatches_, pairs, actions);
  slots_.assign(4 * static_cast<size_t>(num_stages_) * static_cast<size_t>(num_microbatches_), {});
  for (int r = 0; r < s.num_ranks; ++r) {
    const auto& prog = s.per_rank[static_cast<size_t>(r)];
    for (int pos = 0; pos < static_cast<int>(prog.size()); ++pos) {
      const Action& a = prog[static_cast<size_t>(pos)];
      if (a.stage < 0 || a.stage >= s.num_stages)
        fail("rank {}, step {}: action {} names stage {}, but stages are 0..{}", r, pos + 1,
             to_string(a), a.stage, s.num_stages - 1);
      if (a.microbatch < 0 || a.microbatch >= s.num_microbatches)
        fail("rank {}, step {}: action {} names microbatch {}, but microbatches are 0..{}", r,
             pos + 1, to_string(a), a.microbatch, s.num_microbatches - 1);
      const int owner = s.stage_to_rank[static_cast<size_t>(a.stage)];
      if (owner != r)
        fail("rank {}, step {}: action {} is on the wrong rank: stage {} lives on rank {}", r,
             pos + 1, to_string(a), a.stage, owner);
      Slot& slot = slots_[(op_index(a.op) * static_cast<size_t>(num_stages_) +
                           static_cast<size_t>(a.stage)) *
                              static_cast<size_t>(num_microbatches_) +
                          static_cast<size_t>(a.microbatch)];
      if (slot.present())
        fail("rank {}, step {}: duplicate action {} (already at step {})", r, pos + 1,
             to_string(a), slot.pos + 1);
      slot = {r, pos};
    }
  }
  for (int st = 0; st < s.num_stages; ++st) {
    const int r = s.stage_to_rank[static_cast<size_t>(st)];
    for (int m = 0; m < s.num_microbatches; ++m) {
      auto name = [&](Op op) { return to_string(Action{op, m, st}); };
      const bool f = at(Op::F, m, st).present(), b = at(Op::B, m, st).present();
      const bool i = at(Op::I, m, st).present(), w = at(Op::W, m, st).present();
      if (!f) fail("rank {}: missing action {} (forward of microbatch {} on stage {})", r,
                   name(Op::F), m, st);
      if (w && !i)
        fail("rank {}, step {}: {} without {} (W needs the backward split into I + W)", r,
             at(Op::W, m, st).pos + 1, name(Op::W), name(Op::I));
      if (b && i)
        fail("rank {}, step {}: {} and {} both present: use either B or I + W", r,
             at(Op::I, m, st).pos + 1, name(Op::B), name(Op::I));
      if (i && !w)
        fail("rank {}, step {}: {} without {}: missing action {}", r, at(Op::I, m, st).pos + 1,
             name(Op::I), name(Op::W), name(Op::W));
      if (!b && !i)
        fail("rank {}: missing action {} (backward of microbatch {} on stage {}; or {} + {})", r,
             name(Op::B), m, st, name(Op::I), name(Op::W));
    }
  }
}

const Slot& ActionTable::at(Op op, int microbatch, int stage) const {
  return slots_[(op_index(op) * static_cast<size_t>(num_stages_) + static_cast<size_t>(stage)) *
                    static_cast<size_t>(num_microbatches_) +
                static_cast<size_t>(microbatch)];
}

Action ActionTable::backward_of(int microbatch, int stage) const {
  return {at(Op::B, microbatch, stage).present() ? Op::B : Op::I, microbatch, stage};
}

}  // namespace pipetrain
