// validate_in_order() and post_for_in_order() (pipetrain/schedule/program.hpp): the
// program under NCCL's rules — messages of a pair match in the order they are posted,
// and each rank's transfers run in groups, in order, with its computes.
#include <fmt/format.h>

#include <map>
#include <vector>

#include "pipetrain/core/error.hpp"
#include "pipetrain/schedule/program.hpp"

namespace pipetrain {

namespace {

// The in-order rules say nothing yet of collectives posted between the transfers.
void refuse_vocab_parallel(const Program& p) {
  if (p.vocab_parallel)
    fail("{}: vocabulary parallelism does not run on in-order transports (comm.p2p = \"nccl\") yet; use "
         "comm.p2p = \"mpi\"",
         p.name);
}

std::string ordinal(size_t k) {  // 1 -> "1st"
  const size_t t = k % 100;
  const char* suffix = (t >= 11 && t <= 13) ? "th" : k % 10 == 1 ? "st" : k % 10 == 2 ? "nd" : k % 10 == 3 ? "rd" : "th";
  return fmt::format("{}{}", k, suffix);
}

bool is_transfer(const Instr& in) { return in.op == InstrOp::Send || in.op == InstrOp::Recv; }

struct End {  // one end of a message: an instruction of a rank
  int rank = -1;
  size_t index = 0;
};

// One run of the program under in-order rules, as far as it goes.
class InOrderRun {
 public:
  explicit InOrderRun(const Program& p) : p_(p), R_(static_cast<size_t>(p.num_ranks)) {
    match();
    group();
    run();
  }
  bool finished() const {
    for (size_t r = 0; r < R_; ++r)
      if (head_[r] < items_[r].size()) return false;
    return true;
  }
  // The first unmet transfer of each stuck rank's head group, with its partner.
  std::vector<std::pair<End, End>> waits() const {
    std::vector<std::pair<End, End>> out;
    for (size_t r = 0; r < R_; ++r) {
      if (head_[r] == items_[r].size()) continue;
      for (size_t i : items_[r][head_[r]])
        if (!met_[r][i]) {
          out.push_back({{static_cast<int>(r), i}, partner_[r][i]});
          break;
        }
    }
    return out;
  }
  // The last transfer of `rank`'s head group (it is stuck there).
  size_t head_group_end(int rank) const { return items_[static_cast<size_t>(rank)][head_[static_cast<size_t>(rank)]].back(); }

 private:
  const std::vector<Instr>& prog(size_t r) const { return p_.per_rank[r]; }

  // The k-th send from a to b is the k-th receive b posts from a.
  void match() {
    std::map<std::pair<int, int>, std::vector<size_t>> sends, recvs;
    partner_.resize(R_);
    for (size_t r = 0; r < R_; ++r) {
      partner_[r].resize(prog(r).size());
      for (size_t i = 0; i < prog(r).size(); ++i) {
        const int me = static_cast<int>(r);
        if (prog(r)[i].op == InstrOp::Send) sends[{me, prog(r)[i].peer}].push_back(i);
        if (prog(r)[i].op == InstrOp::Recv) recvs[{prog(r)[i].peer, me}].push_back(i);
      }
    }
    for (const auto& [pair, s] : sends) {
      const auto& [src, dst] = pair;
      const auto& rv = recvs[pair];
      const auto& sp = prog(static_cast<size_t>(src));
      const auto& dp = prog(static_cast<size_t>(dst));
      for (size_t k = 0; k < s.size() && k < rv.size(); ++k) {
        const Instr &a = sp[s[k]], &b = dp[rv[k]];
        if (value_key(a) != value_key(b) || a.tag != b.tag)
          fail("comm.p2p = \"nccl\" matches the messages of two ranks in the order they are posted: rank {}'s {} "
               "send to rank {} is {} (position {}), but rank {}'s {} receive from rank {} is {} (position {})",
               src, ordinal(k + 1), dst, to_string(a), program_position(p_, src, s[k]), dst, ordinal(k + 1), src,
               to_string(b), program_position(p_, dst, rv[k]));
        partner_[static_cast<size_t>(src)][s[k]] = {dst, rv[k]};
        partner_[static_cast<size_t>(dst)][rv[k]] = {src, s[k]};
      }
    }
  }

  // Each rank's list as items: a compute (no transfers: it runs at once), or a group of
  // consecutive transfers. MOVEs are local copies: they neither join nor split a group.
  void group() {
    items_.resize(R_);
    item_of_.resize(R_);
    for (size_t r = 0; r < R_; ++r) {
      item_of_[r].assign(prog(r).size(), 0);
      bool open = false;
      for (size_t i = 0; i < prog(r).size(); ++i) {
        if (prog(r)[i].op == InstrOp::Move) continue;
        const bool transfer = is_transfer(prog(r)[i]);
        if (!transfer || !open) items_[r].push_back({});
        open = transfer;
        if (transfer) items_[r].back().push_back(i);
        item_of_[r][i] = items_[r].size() - 1;
      }
    }
  }

  // A head group finishes once each of its transfers has met its partner, which happens
  // when the partner's rank has the partner's group at its head.
  void run() {
    head_.assign(R_, 0);
    met_.resize(R_);
    for (size_t r = 0; r < R_; ++r) met_[r].assign(prog(r).size(), 0);
    auto at_head = [&](const End& o) {
      const auto r = static_cast<size_t>(o.rank);
      return head_[r] < items_[r].size() && item_of_[r][o.index] == head_[r];
    };
    for (bool progress = true; progress;) {
      progress = false;
      for (size_t r = 0; r < R_; ++r) {
        while (head_[r] < items_[r].size()) {
          bool all = true;
          for (size_t i : items_[r][head_[r]]) {
            if (met_[r][i]) continue;
            const End o = partner_[r][i];
            if (at_head(o))
              met_[r][i] = met_[static_cast<size_t>(o.rank)][o.index] = 1;
            else
              all = false;
          }
          if (!all) break;
          ++head_[r];
          progress = true;
        }
      }
    }
  }

  const Program& p_;
  size_t R_;
  std::vector<std::vector<End>> partner_;
  std::vector<std::vector<std::vector<size_t>>> items_;  // per rank: per item, its transfers
  std::vector<std::vector<size_t>> item_of_;
  std::vector<size_t> head_;
  std::vector<std::vector<char>> met_;
};

}  // namespace

void validate_in_order(const Program& p) {
  refuse_vocab_parallel(p);
  const InOrderRun run(p);
  if (run.finished()) return;
  std::string msg;
  for (const auto& [mine, theirs] : run.waits())
    msg += fmt::format("{} rank {} waits at {} (position {}) for rank {}'s {} (position {})", msg.empty() ? "" : ";",
                       mine.rank, to_string(p.per_rank[static_cast<size_t>(mine.rank)][mine.index]),
                       program_position(p, mine.rank, mine.index), theirs.rank,
                       to_string(p.per_rank[static_cast<size_t>(theirs.rank)][theirs.index]),
                       program_position(p, theirs.rank, theirs.index));
  fail("program {}: deadlock with in-order transfers (comm.p2p = \"nccl\"):{}; post the receives earlier, or use "
       "comm.p2p = \"mpi\"",
       p.name, msg);
}

namespace {

// Each rank's receives from a peer reordered into the order the peer sends them: the
// receive of the k-th message moves up to where the k-th receive was (earlier, so it is
// still posted before its use).
void receive_in_send_order(Program& p) {
  const int R = p.num_ranks;
  for (int src = 0; src < R; ++src)
    for (int dst = 0; dst < R; ++dst) {
      std::vector<ValueKey> sent;
      for (const Instr& in : p.per_rank[static_cast<size_t>(src)])
        if (in.op == InstrOp::Send && in.peer == dst) sent.push_back(value_key(in));
      auto& list = p.per_rank[static_cast<size_t>(dst)];
      size_t k = 0;
      for (size_t i = 0; i < list.size() && k < sent.size(); ++i) {
        if (list[i].op != InstrOp::Recv || list[i].peer != src) continue;
        if (value_key(list[i]) != sent[k]) {
          size_t j = i + 1;
          while (j < list.size() && !(list[j].op == InstrOp::Recv && list[j].peer == src && value_key(list[j]) == sent[k])) ++j;
          if (j == list.size()) return;  // unmatched: validate_program reports it
          const Instr recv = list[j];
          list.erase(list.begin() + static_cast<long>(j));
          list.insert(list.begin() + static_cast<long>(i), recv);
        }
        ++k;
      }
    }
}

}  // namespace

Program post_for_in_order(Program p) {
  refuse_vocab_parallel(p);
  for (auto& prog : p.per_rank)  // receives may move between a pair's computes: run pairs in order
    for (Instr& in : prog) in.overlaps_next = false;
  receive_in_send_order(p);
  for (;;) {
    const InOrderRun run(p);
    if (run.finished()) return p;
    // A send waiting for a receive its peer posts later: post that receive in the group
    // the peer is waiting in. Every earlier message of the pair has met its partner, so
    // the pair's order is kept; a receive only moves earlier, so it stays before its use.
    bool moved = false;
    for (const auto& [mine, theirs] : run.waits()) {
      if (p.per_rank[static_cast<size_t>(mine.rank)][mine.index].op != InstrOp::Send) continue;
      auto& peer = p.per_rank[static_cast<size_t>(theirs.rank)];
      const size_t to = run.head_group_end(theirs.rank) + 1;
      if (theirs.index < to) continue;  // already in the peer's head group (cannot happen)
      const Instr recv = peer[theirs.index];
      peer.erase(peer.begin() + static_cast<long>(theirs.index));
      peer.insert(peer.begin() + static_cast<long>(to), recv);
      moved = true;
      break;
    }
    if (!moved) validate_in_order(p);  // every stuck rank waits for a send: a real deadlock, reported
  }
}

}  // namespace pipetrain
