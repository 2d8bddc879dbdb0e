// validate_program() (pipetrain/schedule/program.hpp): static checks of every rank's
// instruction list, the matching of transfers across ranks, then an all-ranks
// execution that finds deadlocks.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "pipetrain/core/error.hpp"
#include "pipetrain/schedule/program.hpp"

namespace pipetrain {

namespace {

using Value = ValueKey;
using Cell = std::pair<int, int>;  // microbatch, stage

struct Where {
  int rank = -1, pos = -1;  // pos: 0-based index in the rank's list
};

size_t position(const Program& p, int rank, size_t pos) { return program_position(p, rank, pos); }

[[noreturn]] void at(const Program& p, int rank, size_t pos, const std::string& what) {
  fail("rank {}, position {} ({}): {}", rank, position(p, rank, pos),
       to_string(p.per_rank[static_cast<size_t>(rank)][pos]), what);
}

// The program's dataflow rule (program.hpp), on the value keys used here.
bool input_of(const Program& p, const Action& a, Value& v) {
  Instr i;
  if (!pipetrain::input_of(a, p.num_stages, i)) return false;
  return v = value_key(i), true;
}
bool output_of(const Program& p, const Action& a, Value& v) {
  Instr i;
  if (!pipetrain::output_of(a, p.num_stages, p.backward, i)) return false;
  return v = value_key(i), true;
}
int producer_stage(const Value& v) { return std::get<0>(v) == 0 ? std::get<2>(v) - 1 : std::get<2>(v) + 1; }

void check_shape(const Program& p) {
  if (p.num_stages < 1 || p.num_ranks < 1 || p.num_microbatches < 1)
    fail("program {}: {} stages, {} ranks, {} microbatches", p.name, p.num_stages, p.num_ranks, p.num_microbatches);
  if (static_cast<int>(p.stage_to_rank.size()) != p.num_stages || static_cast<int>(p.per_rank.size()) != p.num_ranks)
    fail("program {}: {} stage placements and {} rank lists for {} stages and {} ranks", p.name, p.stage_to_rank.size(),
         p.per_rank.size(), p.num_stages, p.num_ranks);
  for (int s = 0; s < p.num_stages; ++s)
    if (p.stage_to_rank[static_cast<size_t>(s)] < 0 || p.stage_to_rank[static_cast<size_t>(s)] >= p.num_ranks)
      fail("program {}: stage {} is placed on rank {}, but ranks are 0..{}", p.name, s,
           p.stage_to_rank[static_cast<size_t>(s)], p.num_ranks - 1);
}

// An overlapped pair: an F, then a B or I of another stage (F&B) or an F that does not take
// the first's output (F&F), that overlaps nothing itself, with only the F's output between
// them. The executor starts the second at the F's first pause and gives the F's output when
// the F ends, so the pair runs as the list in order would (walk_program's semantics) given
// one more condition: the second must not need the F's output — a B cannot (its input is a
// gradient, an F's output an activation); an F&F pair's second is checked here.
void check_pair(const Program& p, int r, size_t pos) {
  const auto& prog = p.per_rank[static_cast<size_t>(r)];
  size_t next = pos + 1;
  Instr out;
  const bool gives = pipetrain::output_of(prog[pos].action, p.num_stages, p.backward, out);
  for (; next < prog.size() && prog[next].op != InstrOp::Compute; ++next)
    if (!gives || (prog[next].op != InstrOp::Send && prog[next].op != InstrOp::Move) ||
        value_key(prog[next]) != value_key(out))
      at(p, r, next, "stands inside an overlapped pair, where only the F's output may leave");
  if (next >= prog.size()) at(p, r, pos, "an overlapped pair's F, but no compute follows it");
  const Action &f = prog[pos].action, &b = prog[next].action;
  if (f.op != Op::F || b.op == Op::W)
    at(p, r, pos,
       fmt::format("an overlapped pair is an F, then a B, I or F; here {} and {}", to_string(f), to_string(b)));
  if (b.op != Op::F && f.stage == b.stage)
    at(p, r, pos, fmt::format("an F&B pair's two actions are both of stage {}", f.stage));
  Value in{};
  if (b.op == Op::F && gives && input_of(p, b, in) && in == value_key(out))
    at(p, r, pos, fmt::format("an F&F pair's second, {}, takes the first's output", to_string(b)));
  if (prog[next].overlaps_next) at(p, r, next, "an overlapped pair's second, but marked as the F of another");
}

// One rank's list in order: values exist before they leave, receives are posted before
// use, stashes live from F to their free. Returns the peak of live stashes.
int check_rank(const Program& p, int r, std::map<Cell, int>& f_count, std::map<Cell, int>& b_count,
               std::map<Cell, int>& i_count, std::map<Cell, int>& w_count) {
  auto rank_of = [&](int stage) { return p.stage_to_rank[static_cast<size_t>(stage)]; };
  const auto& prog = p.per_rank[static_cast<size_t>(r)];
  std::set<Value> produced, posted, moved;
  std::set<Cell> live, after_i;
  int peak = 0;
  for (size_t pos = 0; pos < prog.size(); ++pos) {
    const Instr& in = prog[pos];
    if (in.op == InstrOp::Vocab || in.op == InstrOp::Coll) continue;  // validate_vocab
    if (in.op != InstrOp::Compute) {
      const Value v = value_key(in);
      if (in.stage < 0 || in.stage >= p.num_stages || producer_stage(v) < 0 || producer_stage(v) >= p.num_stages ||
          in.microbatch < 0 || in.microbatch >= p.num_microbatches)
        at(p, r, pos, "names a stage or microbatch outside the program");
      if (in.kind == Transfer::Gradient && !p.backward) at(p, r, pos, "a gradient in a forward-only program");
      const int src = rank_of(producer_stage(v)), dst = rank_of(in.stage);
      if (in.op == InstrOp::Recv) {
        if (dst != r || src == r)
          at(p, r, pos, fmt::format("stage {} is on rank {}, its producer on rank {}", in.stage, dst, src));
        if (in.peer != src)
          at(p, r, pos, fmt::format("receives from rank {}, but the producer is on rank {}", in.peer, src));
        if (!posted.insert(v).second) at(p, r, pos, "posted twice");
      } else {  // Send or Move: the producer is here and has run
        if (src != r) at(p, r, pos, fmt::format("the producer, stage {}, is on rank {}", producer_stage(v), src));
        if (in.op == InstrOp::Send && (dst == r || in.peer != dst))
          at(p, r, pos, fmt::format("sends to rank {}, but stage {} is on rank {}", in.peer, in.stage, dst));
        if (in.op == InstrOp::Move && dst != r)
          at(p, r, pos, fmt::format("stage {} is on rank {}: a SEND, not a MOVE", in.stage, dst));
        if (produced.erase(v) == 0) at(p, r, pos, "its value is not computed before it (or already sent)");
        if (in.op == InstrOp::Move) moved.insert(v);
      }
      continue;
    }
    const Action& a = in.action;
    if (a.stage < 0 || a.stage >= p.num_stages || a.microbatch < 0 || a.microbatch >= p.num_microbatches)
      at(p, r, pos, "names a stage or microbatch outside the program");
    if (rank_of(a.stage) != r) at(p, r, pos, fmt::format("stage {} lives on rank {}", a.stage, rank_of(a.stage)));
    if (!p.backward && a.op != Op::F) at(p, r, pos, "a backward action in a forward-only program");
    if (in.overlaps_next) check_pair(p, r, pos);
    const Cell cell{a.microbatch, a.stage};
    Value v{};
    if (input_of(p, a, v)) {
      const bool local = rank_of(producer_stage(v)) == r;
      if (local ? moved.erase(v) == 0 : posted.erase(v) == 0)
        at(p, r, pos,
           local ? "its input is not moved to it before it"
                 : fmt::format("no receive of its input from rank {} is posted before it", rank_of(producer_stage(v))));
    }
    switch (a.op) {
      case Op::F:
        ++f_count[cell];
        live.insert(cell);
        break;
      case Op::B:
        ++b_count[cell];
        if (!live.count(cell)) at(p, r, pos, "runs before the forward of its microbatch (or after its free)");
        break;
      case Op::I:
        ++i_count[cell];
        if (!live.count(cell)) at(p, r, pos, "runs before the forward of its microbatch (or after its free)");
        after_i.insert(cell);
        break;
      case Op::W:
        ++w_count[cell];
        if (!after_i.count(cell)) at(p, r, pos, "runs before the I of its microbatch");
        break;
    }
    peak = std::max(peak, static_cast<int>(live.size()));
    if (in.frees_stash && live.erase(cell) == 0) at(p, r, pos, "frees a stash that is not alive");
    if (output_of(p, a, v)) produced.insert(v);
  }
  if (!live.empty()) {
    const auto [m, s] = *live.begin();
    fail("rank {}: the stash of microbatch {} at stage {} is never freed", r, m, s);
  }
  if (!produced.empty()) {
    const auto [k, m, s] = *produced.begin();
    fail("rank {}: the {} feeding stage {} of microbatch {} is computed but never sent or moved", r,
         k == 0 ? "activation" : "gradient", s, m);
  }
  if (!posted.empty()) {
    const auto [k, m, s] = *posted.begin();
    fail("rank {}: a receive of the {} feeding stage {} of microbatch {} is posted but never used", r,
         k == 0 ? "activation" : "gradient", s, m);
  }
  return peak;
}

// Every send has exactly one receive with the same tag; tags are unique per pair.
void match_transfers(const Program& p, int tag_ub) {
  std::map<Value, std::pair<Where, const Instr*>> sends, recvs;
  std::map<std::tuple<int, int, int>, Value> tag_use;  // (src, dst, tag)
  for (int r = 0; r < p.num_ranks; ++r) {
    const auto& prog = p.per_rank[static_cast<size_t>(r)];
    for (size_t pos = 0; pos < prog.size(); ++pos) {
      const Instr& in = prog[pos];
      if (in.op != InstrOp::Send && in.op != InstrOp::Recv) continue;
      if (in.tag < 0 || in.tag > tag_ub)
        at(p, r, pos, fmt::format("tag {} is outside 0..MPI_TAG_UB = {}", in.tag, tag_ub));
      auto& side = in.op == InstrOp::Send ? sends : recvs;
      if (!side.emplace(value_key(in), std::pair{Where{r, static_cast<int>(pos)}, &in}).second)
        at(p, r, pos, in.op == InstrOp::Send ? "sent twice" : "received twice");
      if (in.op == InstrOp::Send) {
        const auto key = std::tuple{r, in.peer, in.tag};
        if (auto [it, fresh] = tag_use.emplace(key, value_key(in)); !fresh)
          at(p, r, pos, fmt::format("tag {} is already used from rank {} to rank {}", in.tag, r, in.peer));
      }
    }
  }
  for (const auto& [v, s] : sends) {
    auto it = recvs.find(v);
    if (it == recvs.end()) at(p, s.first.rank, static_cast<size_t>(s.first.pos), "no rank receives it");
    if (it->second.second->tag != s.second->tag)
      at(p, it->second.first.rank, static_cast<size_t>(it->second.first.pos),
         fmt::format("tag {} differs from the send's {} (rank {}, position {})", it->second.second->tag, s.second->tag,
                     s.first.rank, position(p, s.first.rank, static_cast<size_t>(s.first.pos))));
  }
  for (const auto& [v, rc] : recvs)
    if (!sends.count(v)) at(p, rc.first.rank, static_cast<size_t>(rc.first.pos), "no rank sends it");
}

void check_complete(const Program& p, const std::map<Cell, int>& f, const std::map<Cell, int>& b,
                    const std::map<Cell, int>& i, const std::map<Cell, int>& w) {
  auto n = [](const std::map<Cell, int>& c, const Cell& k) {
    auto it = c.find(k);
    return it == c.end() ? 0 : it->second;
  };
  for (int m = 0; m < p.num_microbatches; ++m)
    for (int s = 0; s < p.num_stages; ++s) {
      const Cell k{m, s};
      if (n(f, k) != 1) fail("program {}: {}F{} appears {} times (once expected)", p.name, s, m, n(f, k));
      if (!p.backward) continue;
      const bool full = n(b, k) == 1 && n(i, k) == 0 && n(w, k) == 0;
      const bool split = n(b, k) == 0 && n(i, k) == 1 && n(w, k) == 1;
      if (!full && !split)
        fail("program {}: microbatch {} at stage {} has {} B, {} I and {} W (one B, or one I and one W)", p.name, m, s,
             n(b, k), n(i, k), n(w, k));
    }
}

// All ranks together (walk_program's semantics); reports what each stuck rank waits for,
// at its position in the program and its step in the rank's compute order (a schedule's
// own numbering).
void check_progress(const Program& p) {
  const std::vector<size_t> next = walk_program(p, [](int, const Instr&) {});
  std::string msg;
  for (size_t r = 0; r < next.size(); ++r) {
    const auto& prog = p.per_rank[r];
    if (next[r] >= prog.size()) continue;
    const Instr& in = prog[next[r]];
    size_t step = 0;
    for (size_t i = 0; i <= next[r]; ++i) step += prog[i].op == InstrOp::Compute;
    msg += fmt::format("{} rank {} waits at {} (position {}, compute step {}) for ", msg.empty() ? "" : ";", r,
                       to_string(in), position(p, static_cast<int>(r), next[r]), step);
    Instr send;  // the transfer or collective it waits for
    if (collective_input(p, in, send)) {
      std::vector<int> missing;
      const int root = awaited_post(p, send.coll);
      for (size_t q = 0; q < next.size(); ++q) {
        if (root >= 0 && static_cast<int>(q) != root) continue;  // a broadcast waits for its root alone
        bool posted = false;
        for (size_t i = 0; i < next[q] && !posted; ++i) {
          const Instr& x = p.per_rank[q][i];
          posted = x.op == InstrOp::Coll && x.coll == send.coll && x.microbatch == send.microbatch;
        }
        if (!posted) missing.push_back(static_cast<int>(q));
      }
      msg += fmt::format("{}, not yet posted by rank{} {}", to_string(send), missing.size() > 1 ? "s" : "",
                         fmt::join(missing, ", "));
      continue;
    }
    pipetrain::input_of(in.action, p.num_stages, send);
    send.op = InstrOp::Send;
    msg += fmt::format("the {} {} (rank {})", send.kind == Transfer::Activation ? "activation" : "gradient",
                       to_string(send), p.stage_to_rank[static_cast<size_t>(pipetrain::producer_stage(send))]);
  }
  if (!msg.empty()) throw Error("deadlock:" + msg);
}

// An overlapped pair's second may wait for its input before the F's output has left (its
// first step blocks on it under fixed turns), so the program must also progress with each
// pair's F output placed after the second: the second's input never needs the F's output,
// through any rank.
void check_pairs_progress(const Program& p) {
  Program late = p;
  bool pairs = false;
  for (auto& prog : late.per_rank)
    for (size_t i = 0; i < prog.size(); ++i) {
      if (prog[i].op != InstrOp::Compute || !prog[i].overlaps_next) continue;
      size_t j = i + 1;
      while (j < prog.size() && prog[j].op != InstrOp::Compute) ++j;
      if (j == prog.size()) break;  // check_pair has refused it
      std::rotate(prog.begin() + static_cast<long>(i) + 1, prog.begin() + static_cast<long>(j),
                  prog.begin() + static_cast<long>(j) + 1);
      pairs = true;
      i = j;
    }
  if (!pairs) return;
  try {
    check_progress(late);
  } catch (const Error& e) {
    throw Error(
        fmt::format("an overlapped pair's second needs its F's output first (with each pair's F output after "
                    "its second, the program stops): {}",
                    e.what()));
  }
}

}  // namespace

// Positions count the instructions a compute+comms CSV lists: MOVEs are implicit there.
size_t program_position(const Program& p, int rank, size_t index) {
  const auto& prog = p.per_rank[static_cast<size_t>(rank)];
  size_t n = 0;
  for (size_t i = 0; i <= index && i < prog.size(); ++i) n += prog[i].op != InstrOp::Move;
  return n;
}

std::vector<int> validate_program(const Program& p, int tag_ub) {
  check_shape(p);
  std::map<Cell, int> f, b, i, w;
  std::vector<int> peaks;
  for (int r = 0; r < p.num_ranks; ++r) peaks.push_back(check_rank(p, r, f, b, i, w));
  check_complete(p, f, b, i, w);
  validate_vocab(p);
  match_transfers(p, tag_ub);
  check_progress(p);
  check_pairs_progress(p);
  return peaks;
}

}  // namespace pipetrain
