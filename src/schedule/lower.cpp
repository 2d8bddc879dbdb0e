// lower() and forward_only_schedule() (pipetrain/schedule/program.hpp): the dependency
// rule turned into explicit transfers.
#include <algorithm>
#include <fmt/format.h>
#include <set>

#include "pipetrain/core/error.hpp"
#include "pipetrain/schedule/program.hpp"

namespace pipetrain {

bool input_of(const Action& a, int num_stages, Instr& v) {
  v.microbatch = a.microbatch;
  v.stage = a.stage;
  if (a.op == Op::F && a.stage > 0) return v.kind = Transfer::Activation, true;
  if ((a.op == Op::B || a.op == Op::I) && a.stage + 1 < num_stages) return v.kind = Transfer::Gradient, true;
  return false;
}

bool output_of(const Action& a, int num_stages, bool with_gradients, Instr& v) {
  v.microbatch = a.microbatch;
  if (a.op == Op::F && a.stage + 1 < num_stages) return v.kind = Transfer::Activation, v.stage = a.stage + 1, true;
  if (with_gradients && (a.op == Op::B || a.op == Op::I) && a.stage > 0)
    return v.kind = Transfer::Gradient, v.stage = a.stage - 1, true;
  return false;
}

int producer_stage(const Instr& v) { return v.kind == Transfer::Activation ? v.stage - 1 : v.stage + 1; }

bool collective_input(const Program& p, const Instr& in, Instr& coll) {
  if (!p.vocab_parallel) return false;
  coll = Instr{};
  coll.op = InstrOp::Coll;
  coll.microbatch = in.op == InstrOp::Compute ? in.action.microbatch : in.microbatch;
  if (in.op == InstrOp::Compute) {
    const Action& a = in.action;
    if (a.op == Op::F && a.stage == 0) return coll.coll = Coll::EmbedSum, true;
    if ((a.op == Op::B || a.op == Op::I) && a.stage == p.num_stages - 1) return coll.coll = Coll::HiddenGrad, true;
    return false;
  }
  if (in.op != InstrOp::Vocab) return false;
  switch (in.vocab) {
    case VocabOp::OutputForward: return coll.coll = Coll::Hidden, true;
    case VocabOp::OutputBackward: return coll.coll = Coll::Stats, true;
    case VocabOp::EmbedBackward: return coll.coll = Coll::EmbedGrad, true;
    case VocabOp::EmbedForward: return false;
  }
  return false;
}

int collective_root(const Program& p, Coll c) {
  switch (c) {
    case Coll::EmbedSum:
    case Coll::EmbedGrad: return p.stage_to_rank.front();
    case Coll::Hidden:
    case Coll::HiddenGrad: return p.stage_to_rank.back();
    case Coll::Stats: return -1;
  }
  return -1;
}

int awaited_post(const Program& p, Coll c) {
  return c == Coll::Hidden || c == Coll::EmbedGrad ? collective_root(p, c) : -1;
}

Schedule forward_only_schedule(const std::vector<int>& stage_to_rank, int num_ranks, int num_microbatches) {
  Schedule s;
  s.name = "forward-only";
  s.num_stages = static_cast<int>(stage_to_rank.size());
  s.num_ranks = num_ranks;
  s.num_microbatches = num_microbatches;
  s.stage_to_rank = stage_to_rank;
  s.per_rank.resize(static_cast<size_t>(num_ranks));
  for (int m = 0; m < num_microbatches; ++m)
    for (int st = 0; st < s.num_stages; ++st)
      s.per_rank[static_cast<size_t>(stage_to_rank[static_cast<size_t>(st)])].push_back({Op::F, m, st});
  return s;
}

Program lower(const Schedule& s, const LowerOptions& options) {
  Program p;
  p.name = s.name;
  p.num_stages = s.num_stages;
  p.num_ranks = s.num_ranks;
  p.num_microbatches = s.num_microbatches;
  p.stage_to_rank = s.stage_to_rank;
  p.backward = std::any_of(s.per_rank.begin(), s.per_rank.end(), [](const auto& prog) {
    return std::any_of(prog.begin(), prog.end(), [](const Action& a) { return a.op != Op::F; });
  });
  const TagPlan tags(s.stage_to_rank, s.num_microbatches, p.backward, options.tag_ub);
  auto rank_of = [&](int stage) { return s.stage_to_rank[static_cast<size_t>(stage)]; };
  const size_t ahead = static_cast<size_t>(std::max(1, options.recv_lookahead));
  p.per_rank.resize(static_cast<size_t>(s.num_ranks));
  for (int r = 0; r < s.num_ranks; ++r) {
    const auto& actions = s.per_rank[static_cast<size_t>(r)];
    auto& out = p.per_rank[static_cast<size_t>(r)];
    // The last action of each (microbatch, stage) frees its stash: B, W, or (forward
    // only) F itself.
    std::set<std::pair<int, int>> freed;
    std::vector<bool> frees(actions.size(), false);
    for (size_t i = actions.size(); i-- > 0;) {
      const Action& a = actions[i];
      if ((p.backward && a.op == Op::I) || (p.backward && a.op == Op::F)) continue;
      frees[i] = freed.insert({a.microbatch, a.stage}).second;
    }
    // The output of action i: a MOVE to a stage here, or a SEND.
    auto give = [&](size_t i) {
      Instr t;
      if (!output_of(actions[i], s.num_stages, p.backward, t)) return;
      if (rank_of(t.stage) == r) {
        t.op = InstrOp::Move;
        t.peer = r;
      } else {
        t.op = InstrOp::Send;
        t.peer = rank_of(t.stage);
        t.tag = tags.tag(t.kind, t.microbatch, t.stage);
      }
      out.push_back(t);
    };
    std::set<int> pairs;
    if (static_cast<size_t>(r) < s.pairs.size()) pairs.insert(s.pairs[size_t(r)].begin(), s.pairs[size_t(r)].end());
    size_t unposted = 0;  // the first action whose input receive is not yet placed
    for (size_t i = 0; i < actions.size(); ++i) {
      // An overlapped pair: the receives of both before the F; only the F's output between the two.
      const bool paired = pairs.count(static_cast<int>(i)) > 0;
      // Before compute i: the receives of the inputs of computes i .. i + ahead - 1 (+ 1 in a pair).
      for (; unposted < actions.size() && unposted < i + ahead + paired; ++unposted) {
        Instr recv;
        if (!input_of(actions[unposted], s.num_stages, recv) || rank_of(producer_stage(recv)) == r) continue;
        recv.op = InstrOp::Recv;
        recv.peer = rank_of(producer_stage(recv));
        recv.tag = tags.tag(recv.kind, recv.microbatch, recv.stage);
        out.push_back(recv);
      }
      Instr c;
      c.action = actions[i];
      c.frees_stash = frees[i];
      c.overlaps_next = paired;
      out.push_back(c);
      give(i);
    }
  }
  return p;
}

std::string to_string(const Instr& i) {
  if (i.op == InstrOp::Compute) return to_string(i.action);
  if (i.op == InstrOp::Vocab) {
    static const char* names[] = {"EF", "OF", "OB", "EB"};
    return fmt::format("{}{}", names[static_cast<int>(i.vocab)], i.microbatch);
  }
  if (i.op == InstrOp::Coll) {
    static const char* names[] = {"REDUCE_E", "BCAST_X", "ALLGATHER_S", "REDUCE_DX", "BCAST_DE"};
    return fmt::format("{}{}", names[static_cast<int>(i.coll)], i.microbatch);
  }
  if (i.op == InstrOp::Shard) {
    static const char* names[] = {"GATHER_W", "FREE_W", "REDUCE_SCATTER_G"};
    const std::string at = i.at_layer < 0 ? "" : fmt::format("@{}", i.at_layer);
    return fmt::format("{}{}.{}{}", names[static_cast<int>(i.shard)], i.stage, i.unit, at);
  }
  const char k = i.kind == Transfer::Activation ? 'F' : 'B';
  const int producer = producer_stage(i);
  switch (i.op) {
    case InstrOp::Send: return fmt::format("{}SEND_{}{}", producer, k, i.microbatch);
    case InstrOp::Recv: return fmt::format("{}RECV_{}{}", i.stage, k, i.microbatch);
    default: return fmt::format("{}MOVE_{}{}", producer, k, i.microbatch);
  }
}

}  // namespace pipetrain
