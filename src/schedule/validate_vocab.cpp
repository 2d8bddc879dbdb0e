// validate_vocab (called by validate_program, pipetrain/schedule/program.hpp): the rules of
// a vocabulary-parallel program's slices and collectives, rank by rank and across ranks.
#include <fmt/format.h>

#include <map>
#include <set>
#include <utility>
#include <vector>

#include "pipetrain/core/error.hpp"
#include "pipetrain/schedule/program.hpp"

namespace pipetrain {

namespace {

using Item = std::pair<int, int>;  // (slice or collective kind, microbatch)

[[noreturn]] void at(const Program& p, int rank, size_t pos, const std::string& what) {
  fail("rank {}, position {} ({}): {}", rank, program_position(p, rank, pos),
       to_string(p.per_rank[static_cast<size_t>(rank)][pos]), what);
}

std::string coll_name(Coll c, int m) {
  Instr i;
  i.op = InstrOp::Coll, i.coll = c, i.microbatch = m;
  return to_string(i);
}

// What a rank must have done before it posts a collective: the slice whose data it
// carries, or (the roots of the broadcasts) the stage's compute that produced it.
bool contributes_after_local(const Program& p, int rank, const Instr& c, const std::set<Item>& slices_done,
                             const std::set<std::pair<int, int>>& backward_done, const std::set<int>& last_forward_done,
                             std::string& missing) {
  const int m = c.microbatch;
  auto slice = [&](VocabOp op, const char* name) {
    missing = fmt::format("{}{}", name, m);
    return slices_done.count({static_cast<int>(op), m}) > 0;
  };
  switch (c.coll) {
    case Coll::EmbedSum:
      return slice(VocabOp::EmbedForward, "EF");
    case Coll::Stats:
      return slice(VocabOp::OutputForward, "OF");
    case Coll::HiddenGrad:
      return slice(VocabOp::OutputForward, "OF");
    case Coll::Hidden:
      missing = fmt::format("{}F{}", p.num_stages - 1, m);
      return rank != collective_root(p, c.coll) || last_forward_done.count(m) > 0;
    case Coll::EmbedGrad:
      missing = fmt::format("0B{} (or 0I{})", m, m);
      return rank != collective_root(p, c.coll) || backward_done.count({m, 0}) > 0;
  }
  return false;
}

// One rank: every slice and collective once per microbatch, each collective after what
// it carries, each consumer after its collective's post, OB after OF. Returns the rank's
// sequence of collectives.
std::vector<Item> check_rank_slices(const Program& p, int r) {
  const auto& prog = p.per_rank[static_cast<size_t>(r)];
  std::set<Item> slices, posted;
  std::set<std::pair<int, int>> backward_done;  // (microbatch, stage) of B or I
  std::set<int> last_forward_done;
  std::vector<Item> sequence;
  for (size_t pos = 0; pos < prog.size(); ++pos) {
    const Instr& in = prog[pos];
    if ((in.op == InstrOp::Vocab || in.op == InstrOp::Coll) &&
        (in.microbatch < 0 || in.microbatch >= p.num_microbatches))
      at(p, r, pos, "names a microbatch outside the program");
    Instr c;
    if (collective_input(p, in, c) && !posted.count({static_cast<int>(c.coll), c.microbatch}))
      at(p, r, pos, fmt::format("{} is not posted before it", to_string(c)));
    if (in.op == InstrOp::Compute) {
      const Action& a = in.action;
      if (a.op == Op::F && a.stage == p.num_stages - 1) last_forward_done.insert(a.microbatch);
      if (a.op == Op::B || a.op == Op::I) backward_done.insert({a.microbatch, a.stage});
    } else if (in.op == InstrOp::Vocab) {
      if (!p.backward && in.vocab == VocabOp::EmbedBackward)
        at(p, r, pos, "a backward slice in a forward-only program");
      if (in.vocab == VocabOp::OutputBackward &&
          !slices.count({static_cast<int>(VocabOp::OutputForward), in.microbatch}))
        at(p, r, pos, fmt::format("runs before OF{}, whose logits it needs", in.microbatch));
      if (!slices.insert({static_cast<int>(in.vocab), in.microbatch}).second) at(p, r, pos, "runs twice");
    } else if (in.op == InstrOp::Coll) {
      if (!p.backward && (in.coll == Coll::HiddenGrad || in.coll == Coll::EmbedGrad))
        at(p, r, pos, "a gradient in a forward-only program");
      if (in.peer != collective_root(p, in.coll))
        at(p, r, pos,
           fmt::format("names rank {} as its root, but it is rank {}", in.peer, collective_root(p, in.coll)));
      std::string missing;
      if (!contributes_after_local(p, r, in, slices, backward_done, last_forward_done, missing))
        at(p, r, pos, fmt::format("posted before {}, whose data it carries", missing));
      const Item key{static_cast<int>(in.coll), in.microbatch};
      if (!posted.insert(key).second) at(p, r, pos, "posted twice");
      sequence.push_back(key);
    }
  }
  const int slices_each = p.backward ? 4 : 3;
  for (int m = 0; m < p.num_microbatches; ++m) {
    for (int k = 0; k < slices_each; ++k)
      if (!slices.count({k, m})) {
        Instr v;
        v.op = InstrOp::Vocab, v.vocab = static_cast<VocabOp>(k), v.microbatch = m;
        fail("rank {}: {} never runs (every rank runs its slice of every microbatch)", r, to_string(v));
      }
    for (int k = 0; k < 5; ++k) {
      const Coll c = static_cast<Coll>(k);
      if (!p.backward && (c == Coll::HiddenGrad || c == Coll::EmbedGrad)) continue;
      if (!posted.count({k, m})) fail("rank {}: {} is never posted", r, coll_name(c, m));
    }
  }
  return sequence;
}

}  // namespace

void validate_vocab(const Program& p) {
  if (!p.vocab_parallel) {
    for (int r = 0; r < p.num_ranks; ++r)
      for (size_t pos = 0; pos < p.per_rank[static_cast<size_t>(r)].size(); ++pos) {
        const InstrOp op = p.per_rank[static_cast<size_t>(r)][pos].op;
        if (op == InstrOp::Vocab || op == InstrOp::Coll)
          at(p, r, pos, "a vocabulary-parallel instruction in a program without vocabulary parallelism");
      }
    return;
  }
  // Every rank posts the same collectives in the same order (MPI's rule for collectives on
  // one communicator): compared with rank 0's.
  const std::vector<Item> reference = check_rank_slices(p, 0);
  for (int r = 1; r < p.num_ranks; ++r) {
    const std::vector<Item> mine = check_rank_slices(p, r);
    for (size_t k = 0; k < std::min(mine.size(), reference.size()); ++k) {
      if (mine[k] == reference[k]) continue;
      fail(
          "rank {} posts {} as its collective {}, but rank 0 posts {}: every rank must post the pipeline group's "
          "collectives in one order",
          r, coll_name(static_cast<Coll>(mine[k].first), mine[k].second), k + 1,
          coll_name(static_cast<Coll>(reference[k].first), reference[k].second));
    }
  }
}

}  // namespace pipetrain
