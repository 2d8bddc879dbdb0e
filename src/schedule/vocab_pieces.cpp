// delay_backwards, place_vocab_pieces and lower_vocab_parallel
// (pipetrain/schedule/vocab_pieces.hpp).
#include "pipetrain/schedule/vocab_pieces.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <map>
#include <set>
#include <tuple>

#include "pipetrain/core/error.hpp"
#include "pipetrain/schedule/validate.hpp"

namespace pipetrain {

Schedule delay_backwards(const Schedule& s, int forwards) {
  Schedule out = s;
  out.pairs.clear();  // reordered, and slices go between computes: a vocabulary-parallel program pairs nothing
  for (auto& actions : out.per_rank) {
    // Each backward action waits for `forwards` more forwards than the schedule gave it;
    // the held ones keep their order (the earliest held is the first released).
    std::vector<Action> order;
    std::deque<std::pair<int, Action>> held;  // (forwards still to pass, action)
    for (const Action& a : actions) {
      if (a.op != Op::F) {
        held.push_back({forwards, a});
        continue;
      }
      order.push_back(a);
      for (auto& h : held) --h.first;
      while (!held.empty() && held.front().first <= 0) {
        order.push_back(held.front().second);
        held.pop_front();
      }
    }
    for (const auto& h : held) order.push_back(h.second);
    actions = std::move(order);
  }
  return out;
}

namespace {

// A slice of one microbatch, run by every rank: pieces are taken in one order on every
// rank (by release), so the collectives they post are too.
struct Piece {
  VocabOp op;
  int m;
  double release = 0;  // when its input can exist, in the timeline the order comes from
};

// The order of the pieces every rank runs alike (each posts collectives), from a timeline
// of the base program's computes (`timing`: a simulation of the base program, or of a
// placement made from it — its slices' events are skipped): EF two microbatches ahead of
// the first stage's F, OF where the last stage's F ends, EB where the first stage's
// backward ends. OB posts nothing: each rank places its own (Builder).
std::vector<Piece> piece_order(const Program& p, const SimResult& timing) {
  std::map<std::tuple<int, int, int>, std::pair<double, double>> when;  // (op, m, stage) -> start, end
  for (const SimEvent& e : timing.events)
    if (e.vocab.empty())
      when[{static_cast<int>(e.action.op == Op::I ? Op::B : e.action.op), e.action.microbatch, e.action.stage}] = {
          e.start, e.end};
  auto at = [&](Op op, int m, int stage) {
    auto it = when.find({static_cast<int>(op), m, stage});
    if (it == when.end()) fail("vocabulary parallelism: {} has no {}{}{}", p.name, stage, op_char(op), m);
    return it->second;
  };
  const int M = p.num_microbatches, last = p.num_stages - 1;
  std::vector<Piece> out;
  for (int m = 0; m < M; ++m) {
    out.push_back({VocabOp::EmbedForward, m, m < 2 ? 0.0 : at(Op::F, m - 2, 0).first});
    out.push_back({VocabOp::OutputForward, m, at(Op::F, m, last).second});
    if (p.backward) out.push_back({VocabOp::EmbedBackward, m, at(Op::B, m, 0).second});
  }
  std::stable_sort(out.begin(), out.end(), [](const Piece& a, const Piece& b) {
    return std::tuple{a.release, static_cast<int>(a.op), a.m} < std::tuple{b.release, static_cast<int>(b.op), b.m};
  });
  return out;
}

// How the builder fits each rank's OB (its weight gradient, needed by nothing but the
// step's end) between the rest: where the rank would otherwise wait — also for an input
// not yet known to arrive (fill_blocked) — and before anything else once more than
// `max_pending` output slices wait for theirs (each holds its logits).
struct Policy {
  bool eager = true;  // a piece runs once its release has come; else only where the rank would wait
  bool before_backward = false;  // eager pieces wait until a backward is next (a forward feeds the next rank)
  bool transfers_first = false;
  bool fill_blocked = true;
  size_t max_pending = 2;
};

constexpr double kNever = 1e300;

// Builds the program by running it: at every step the rank that can start something
// soonest starts it — its next base instruction, its next piece when the piece's input
// exists and either its release has come or the rank would otherwise wait, or one of its
// OBs (Policy). A base compute never runs ahead of a piece it depends on (EF(m) before
// any action of m; OF(m) before any backward of m, whose gradient it gives). The result
// runs as simulated, so it is free of deadlock by construction; validate_program proves
// it again.
class Builder {
 public:
  Builder(const Program& p, const Costs& costs, const TransferCosts& transfer, std::vector<Piece> order, Policy policy)
      : p_(p),
        costs_(costs),
        transfer_(transfer),
        order_(std::move(order)),
        R_(static_cast<size_t>(p.num_ranks)),
        policy_(policy) {
    ranks_.resize(R_);
  }

  Program build() {
    start_.assign(R_, kNever);
    next_.assign(R_, Next::Base);
    dirty_.assign(R_, 1);
    for (;;) {
      double best = kNever;
      size_t who = R_;
      for (size_t r = 0; r < R_; ++r) {
        if (dirty_[r]) start_[r] = next_start(r, next_[r]), dirty_[r] = 0;
        if (start_[r] < best) best = start_[r], who = r;
      }
      if (who == R_) break;
      const Next what = next_[who];
      dirty_[who] = 1;
      if (what == Next::Piece) run_piece(who, best);
      if (what == Next::Weights) run_deferred(who, best, VocabOp::OutputBackward);
      if (what == Next::Embed) run_deferred(who, best, VocabOp::EmbedBackward);
      if (what == Next::Base) run_base(who, best);
    }
    check_all_placed();
    Program out = p_;
    out.vocab_parallel = true;
    for (size_t r = 0; r < R_; ++r) out.per_rank[r] = std::move(ranks_[r].out);
    return out;
  }

 private:
  enum class Next { Base, Piece, Weights, Embed };
  struct Rank {
    size_t base = 0, piece = 0;  // the next base instruction and the next piece
    double now = 0;
    std::vector<Instr> out;
    std::set<std::pair<int, int>> done;            // (VocabOp, m) run here
    std::set<std::tuple<int, int, int>> computed;  // (op, m, stage) run here (I as B)
    std::deque<int> pending;                       // microbatches whose OF ran here, OB not yet
    std::deque<int> embed_pending;                 // microbatches whose BCAST_DE is posted here, EB not yet
  };
  using CollKey = std::pair<int, int>;

  void check_all_placed() const {
    std::string stuck;
    for (size_t r = 0; r < R_; ++r) {
      const Rank& k = ranks_[r];
      if (k.base >= p_.per_rank[r].size() && k.piece >= order_.size() && k.pending.empty() && k.embed_pending.empty())
        continue;
      Instr next;
      if (k.piece < order_.size())
        next.op = InstrOp::Vocab, next.vocab = order_[k.piece].op, next.microbatch = order_[k.piece].m;
      stuck += fmt::format("{} rank {} at {} with {} next", stuck.empty() ? "" : ";", r,
                           k.base < p_.per_rank[r].size() ? to_string(p_.per_rank[r][k.base]) : "its end",
                           k.piece < order_.size() ? to_string(next) : "no slice");
    }
    if (!stuck.empty()) fail("vocabulary parallelism: {} cannot place its slices:{}", p_.name, stuck);
  }

  static Instr coll(Coll c, int m, int root) {
    Instr i;
    i.op = InstrOp::Coll, i.coll = c, i.microbatch = m, i.peer = root;
    return i;
  }
  double cost(VocabOp op) const { return costs_.vocab[static_cast<size_t>(op)]; }
  // The time an entry of the common order takes (EB's entry is its post: the slice waits).
  double entry_cost(VocabOp op) const { return op == VocabOp::EmbedBackward ? 0.0 : cost(op); }
  // When every rank has posted collective c of m (kNever: not all yet), plus its transfer.
  double complete(Coll c, int m) const {
    auto it = posts_.find({static_cast<int>(c), m});
    if (it == posts_.end() || it->second.first < R_) return kNever;
    return it->second.second + transfer_.time();
  }
  double root_posted(Coll c, int m) const {
    auto it = root_post_.find({static_cast<int>(c), m});
    return it == root_post_.end() ? kNever : it->second + transfer_.time();
  }

  // When the rank's next piece could start (kNever: its input is not there yet).
  double piece_ready(size_t r) const {
    const Rank& k = ranks_[r];
    const Piece& v = order_[k.piece];
    const int last = p_.num_stages - 1;
    switch (v.op) {
      case VocabOp::EmbedForward:
        return k.now;
      case VocabOp::OutputForward:
        if (static_cast<int>(r) == collective_root(p_, Coll::Hidden))
          return k.computed.count({static_cast<int>(Op::F), v.m, last}) ? k.now : kNever;
        return std::max(k.now, root_posted(Coll::Hidden, v.m));
      case VocabOp::EmbedBackward:  // the post: the root's data is the first stage's gradient
        if (static_cast<int>(r) == collective_root(p_, Coll::EmbedGrad))
          return k.computed.count({static_cast<int>(Op::B), v.m, 0}) ? k.now : kNever;
        return k.now;
      case VocabOp::OutputBackward:
        break;
    }
    return kNever;
  }

  // Whether compute `a` must wait for a piece this rank has not run.
  bool waits_for_piece(const Rank& k, const Action& a) const {
    if (!k.done.count({static_cast<int>(VocabOp::EmbedForward), a.microbatch})) return true;
    if (a.op != Op::B && a.op != Op::I) return false;
    return !k.done.count({static_cast<int>(VocabOp::OutputForward), a.microbatch});
  }

  // When the rank's next base instruction could start (kNever: not yet).
  double base_ready(size_t r) const {
    const Rank& k = ranks_[r];
    const Instr& in = p_.per_rank[r][k.base];
    if (in.op != InstrOp::Compute) return k.now;
    if (waits_for_piece(k, in.action)) return kNever;
    double t = k.now;
    Instr v;
    if (input_of(in.action, p_.num_stages, v) &&
        p_.stage_to_rank[static_cast<size_t>(producer_stage(v))] != static_cast<int>(r)) {
      auto it = sent_.find(value_key(v));
      t = it == sent_.end() ? kNever : std::max(t, it->second + transfer_.time());
    }
    if (in.action.op == Op::F && in.action.stage == 0) t = std::max(t, complete(Coll::EmbedSum, in.action.microbatch));
    if ((in.action.op == Op::B || in.action.op == Op::I) && in.action.stage == p_.num_stages - 1 && p_.backward)
      t = std::max(t, complete(Coll::HiddenGrad, in.action.microbatch));
    return t;
  }

  // Whether the rank's next base compute is a backward (transfers before it skipped).
  bool next_is_backward(size_t r) const {
    for (size_t i = ranks_[r].base; i < p_.per_rank[r].size(); ++i)
      if (p_.per_rank[r][i].op == InstrOp::Compute) return p_.per_rank[r][i].action.op != Op::F;
    return true;
  }

  // When the rank's oldest OB could start (kNever: none, or its statistics are not there).
  double weights_ready(size_t r) const {
    const Rank& k = ranks_[r];
    return k.pending.empty() ? kNever : std::max(k.now, complete(Coll::Stats, k.pending.front()));
  }
  // When the rank's oldest EB could start (kNever: none, or the gradient is not there).
  double embed_ready(size_t r) const {
    const Rank& k = ranks_[r];
    if (k.embed_pending.empty()) return kNever;
    if (static_cast<int>(r) == collective_root(p_, Coll::EmbedGrad)) return k.now;
    return std::max(k.now, root_posted(Coll::EmbedGrad, k.embed_pending.front()));
  }

  double next_start(size_t r, Next& what) const {
    const Rank& k = ranks_[r];
    const bool has_base = k.base < p_.per_rank[r].size(), has_piece = k.piece < order_.size();
    // Transfers around a compute go with it (they take no time), or wait like it.
    if (policy_.transfers_first && has_base && p_.per_rank[r][k.base].op != InstrOp::Compute)
      return what = Next::Base, k.now;
    const double b = has_base ? base_ready(r) : kNever;
    const double v = has_piece ? piece_ready(r) : kNever;
    // A piece goes first when it can start no later than the base instruction and its
    // release has come, or when the base instruction cannot start before the piece ends.
    const double piece_end = v + (has_piece ? entry_cost(order_[k.piece].op) : 0.0);
    const bool may_go_first = policy_.eager && (!policy_.before_backward || !has_base || next_is_backward(r));
    if (v < kNever && (b >= kNever || (may_go_first && v <= b && order_[k.piece].release <= v) || piece_end <= b))
      return what = Next::Piece, v;
    // EB (cheap) goes once its gradient is there by the time the base instruction could start.
    const double e = embed_ready(r);
    if (e < kNever && (e <= b || (b >= kNever && (policy_.fill_blocked || (!has_base && !has_piece)))))
      return what = Next::Embed, e;
    const double w = weights_ready(r);
    const bool fills = b >= kNever ? policy_.fill_blocked || (!has_base && !has_piece) : w + cost(VocabOp::OutputBackward) <= b;
    if (w < kNever && (fills || (k.pending.size() > policy_.max_pending && (!policy_.before_backward || !has_base ||
                                                                            next_is_backward(r)))))
      return what = Next::Weights, w;
    return what = Next::Base, b;
  }

  void post(size_t r, const Instr& c, double t) {
    ranks_[r].out.push_back(c);
    auto& [n, last] = posts_[{static_cast<int>(c.coll), c.microbatch}];
    ++n, last = std::max(last, t);
    if (static_cast<int>(r) == c.peer) root_post_[{static_cast<int>(c.coll), c.microbatch}] = t;
    if (n == R_ || static_cast<int>(r) == c.peer) dirty_.assign(R_, 1);  // a rank may wait for it
  }

  void run_piece(size_t r, double start) {
    Rank& k = ranks_[r];
    const Piece& v = order_[k.piece++];
    Instr slice;
    slice.op = InstrOp::Vocab, slice.vocab = v.op, slice.microbatch = v.m;
    const double end = start + entry_cost(v.op);
    switch (v.op) {
      case VocabOp::EmbedForward:
        k.out.push_back(slice);
        post(r, coll(Coll::EmbedSum, v.m, collective_root(p_, Coll::EmbedSum)), end);
        break;
      case VocabOp::OutputForward:
        post(r, coll(Coll::Hidden, v.m, collective_root(p_, Coll::Hidden)), start);
        k.out.push_back(slice);
        if (p_.backward) post(r, coll(Coll::HiddenGrad, v.m, collective_root(p_, Coll::HiddenGrad)), end);
        post(r, coll(Coll::Stats, v.m, -1), end);
        k.pending.push_back(v.m);
        break;
      case VocabOp::EmbedBackward:
        post(r, coll(Coll::EmbedGrad, v.m, collective_root(p_, Coll::EmbedGrad)), start);
        k.embed_pending.push_back(v.m);
        break;
      case VocabOp::OutputBackward:
        fail("vocabulary parallelism: OB is placed per rank");
    }
    k.done.insert({static_cast<int>(v.op), v.m});
    k.now = end;
  }

  // OB or EB: a slice each rank places on its own (it posts nothing).
  void run_deferred(size_t r, double start, VocabOp op) {
    Rank& k = ranks_[r];
    std::deque<int>& queue = op == VocabOp::OutputBackward ? k.pending : k.embed_pending;
    Instr slice;
    slice.op = InstrOp::Vocab, slice.vocab = op, slice.microbatch = queue.front();
    queue.pop_front();
    k.out.push_back(slice);
    k.now = start + cost(op);
  }

  void run_base(size_t r, double start) {
    Rank& k = ranks_[r];
    const Instr& in = p_.per_rank[r][k.base++];
    k.out.push_back(in);
    if (in.op == InstrOp::Send) {
      sent_[value_key(in)] = k.now;
      dirty_[static_cast<size_t>(p_.stage_to_rank[static_cast<size_t>(in.stage)])] = 1;  // its consumer's rank
    }
    if (in.op != InstrOp::Compute) return;
    const Action& a = in.action;
    k.computed.insert({static_cast<int>(a.op == Op::I ? Op::B : a.op), a.microbatch, a.stage});
    k.now = start + costs_.of(a);
  }

  const Program& p_;
  const Costs& costs_;
  TransferCosts transfer_;
  std::vector<Piece> order_;
  size_t R_;
  std::vector<Rank> ranks_;
  std::map<ValueKey, double> sent_;
  std::map<CollKey, std::pair<size_t, double>> posts_;  // -> (ranks that posted, last post)
  std::map<CollKey, double> root_post_;
  Policy policy_;
  // Each rank's next start and what it is, recomputed only where something it may wait
  // for has changed (dirty).
  std::vector<double> start_;
  std::vector<Next> next_;
  std::vector<char> dirty_;
};

// The policies tried; the shortest simulated step wins.
std::vector<Policy> policies() {
  std::vector<Policy> out;
  for (int eager : {0, 1, 2})
    for (bool transfers_first : {false, true})
      for (bool fill_blocked : {true, false})
        for (size_t max_pending : {1, 2, 4}) out.push_back({eager > 0, eager == 2, transfers_first, fill_blocked, max_pending});
  return out;
}

}  // namespace

constexpr int kRefinements = 8;


Program place_vocab_pieces(Program p, const Costs& costs, const TransferCosts& transfer) {
  if (p.vocab_parallel) fail("{}: the vocabulary slices are already placed", p.name);
  // Placed by the base program's timeline first; then again by the timeline of the
  // placement itself (its slices move the computes after them), kept while it shortens
  // the step; under both policies for the transfers around a compute. The shortest
  // simulated step wins.
  Program best;
  double best_step = kNever;
  for (const Policy policy : policies()) {
    Program placed;
    SimResult timing;
    try {
      placed = Builder(p, costs, transfer, piece_order(p, simulate_program(p, costs, transfer)), policy).build();
      timing = simulate_program(placed, costs, transfer);
    } catch (const Error&) {
      continue;  // this policy cannot place the slices of this program
    }
    for (int round = 0; round < kRefinements; ++round) {
      Program next;
      SimResult t;
      try {
        next = Builder(p, costs, transfer, piece_order(p, timing), policy).build();
        t = simulate_program(next, costs, transfer);
      } catch (const Error&) {
        break;  // this order does not run: keep the last one that does
      }
      if (t.makespan >= timing.makespan) break;
      placed = std::move(next);
      timing = std::move(t);
    }
    if (timing.makespan < best_step) best = std::move(placed), best_step = timing.makespan;
  }
  if (best_step == kNever) fail("vocabulary parallelism: {} cannot place its slices under any policy", p.name);
  return best;
}

// How many forwards the backwards may be delayed by: each one more stash per rank.
constexpr int kMaxDelay = 2;

Program lower_vocab_parallel(const Schedule& s, const LowerOptions& options, const Costs& costs,
                             const TransferCosts& transfer) {
  const bool backward = std::any_of(s.per_rank.begin(), s.per_rank.end(), [](const auto& actions) {
    return std::any_of(actions.begin(), actions.end(), [](const Action& a) { return a.op != Op::F; });
  });
  if (!backward) return place_vocab_pieces(lower(s, options), costs, transfer);
  // The last stage's backward of a microbatch waits for every rank's OF and OB of it;
  // delaying the backwards gives the ranks room to run them, at a stash each. The
  // shortest simulated step wins, the smaller delay on a tie.
  Program best;
  double best_step = 0;
  for (int delay = 0; delay <= kMaxDelay; ++delay) {
    const Schedule delayed = delay_backwards(s, delay);
    if (delay > 0 && delayed.per_rank == s.per_rank) break;  // nothing to delay (GPipe)
    Program p;
    try {
      validate(delayed);
      p = place_vocab_pieces(lower(delayed, options), costs, transfer);
    } catch (const Error&) {
      if (delay == 0) throw;
      break;  // this schedule cannot wait that long (it would deadlock)
    }
    const double step = simulate_program(p, costs, transfer).makespan;
    if (delay == 0 || step < best_step) best = std::move(p), best_step = step;
  }
  return best;
}

}  // namespace pipetrain
