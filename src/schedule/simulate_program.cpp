// simulate_program() (pipetrain/schedule/simulate.hpp): the timeline of a lowered
// program, transfers included.
#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "pipetrain/core/error.hpp"
#include "pipetrain/schedule/program.hpp"
#include "pipetrain/schedule/simulate.hpp"

namespace pipetrain {

namespace {

// Each rank's data-parallel link under sharded data parallelism: its collectives one after
// the other, and when each gathered unit arrives.
class ShardLink {
 public:
  ShardLink(const Program& p, const Costs& costs) : p_(p), costs_(costs), free_(static_cast<size_t>(p.num_ranks)) {}
  void post(int rank, const Instr& in, double t) {
    if (in.shard == ShardOp::FreeW) return;
    double& link = free_[static_cast<size_t>(rank)];
    const double start = std::max(link, t);
    link = start + (in.shard == ShardOp::GatherW ? costs_.gather : costs_.scatter);
    if (in.shard == ShardOp::GatherW) arrives_[{rank, in.stage, in.unit}] = link;
    events.push_back({Action{}, rank, start, link, to_string(in)});
  }
  std::vector<SimEvent> events;
  // The end of the compute `in` (taking `d` alone) started at `start`: its layers in order,
  // each after its unit's gather and the collectives posted inside it.
  double compute(int rank, const Instr& in, double start, double d) {
    const auto s = static_cast<size_t>(in.action.stage);
    if (s >= p_.stage_layers.size() || p_.stage_layers[s] < 1) return start + d;
    const auto& prog = p_.per_rank[static_cast<size_t>(rank)];
    size_t q = static_cast<size_t>(&in - prog.data()) + 1;
    const int n = p_.stage_layers[s];
    double t = start;
    for (int j = 0; j < n; ++j) {
      const int k = in.action.op == Op::F ? j : n - 1 - j;
      for (; q < prog.size() && prog[q].op == InstrOp::Shard && prog[q].at_layer == k &&
             prog[q].shard == ShardOp::GatherW;
           ++q)
        post(rank, prog[q], t);
      if (const auto it = arrives_.find({rank, in.action.stage, k}); it != arrives_.end() && in.action.op != Op::W)
        t = std::max(t, it->second);
      t += d / n;
      for (; q < prog.size() && prog[q].op == InstrOp::Shard && prog[q].at_layer == k; ++q) post(rank, prog[q], t);
    }
    return t;
  }
  double free_at(int rank) const { return free_[static_cast<size_t>(rank)]; }

 private:
  const Program& p_;
  const Costs& costs_;
  std::vector<double> free_;
  std::map<std::tuple<int, int, int>, double> arrives_;  // (rank, stage, unit) -> its latest gather's end
};

}  // namespace

SimResult simulate_program(const Program& p, const Costs& costs, const TransferCosts& transfer) {
  const auto R = static_cast<size_t>(p.num_ranks);
  std::vector<double> now(R, 0.0);
  std::map<ValueKey, double> send_at, post_at;  // when each SEND was issued / RECV posted
  std::vector<std::set<std::pair<int, int>>> live(R);
  SimResult out;
  out.busy.assign(R, 0.0);
  out.peak_inflight.assign(R, 0);
  std::vector<std::vector<SimEvent>> events(R);
  std::map<std::pair<int, int>, double> posted;  // (collective, microbatch) -> its last post
  std::map<std::pair<int, int>, double> root_post;  // (broadcast, microbatch) -> its root's post
  ShardLink link(p, costs);
  const std::vector<size_t> next = walk_program(p, [&](int rank, const Instr& in) {
    const auto r = static_cast<size_t>(rank);
    if (in.op == InstrOp::Send) send_at[value_key(in)] = now[r];
    if (in.op == InstrOp::Recv) post_at[value_key(in)] = now[r];
    if (in.op == InstrOp::Coll) {
      double& t = posted[{static_cast<int>(in.coll), in.microbatch}];
      t = std::max(t, now[r]);
      if (rank == awaited_post(p, in.coll)) root_post[{static_cast<int>(in.coll), in.microbatch}] = now[r];
    }
    if (in.op == InstrOp::Shard && in.at_layer < 0) link.post(rank, in, now[r]);
    if (in.op != InstrOp::Compute && in.op != InstrOp::Vocab) return;
    double start = now[r];
    Instr v;
    if (in.op == InstrOp::Compute && input_of(in.action, p.num_stages, v) &&
        p.stage_to_rank[static_cast<size_t>(producer_stage(v))] != rank) {
      // walk_program runs a compute only after its input's SEND.
      auto q = post_at.find(value_key(v));
      if (q == post_at.end()) fail("simulate_program: {} on rank {} has no posted receive", to_string(in), r);
      start = std::max(start, std::max(send_at.at(value_key(v)), q->second) + transfer.time());
    }
    // A collective completes a transfer's time after the last post it needs (walk_program
    // runs the consumer only then); a broadcast's root reads its own data.
    if (collective_input(p, in, v)) {
      const std::pair<int, int> key{static_cast<int>(v.coll), v.microbatch};
      const int root = awaited_post(p, v.coll);
      start = std::max(start, (root < 0 ? posted.at(key) : root_post.at(key)) + (root == rank ? 0.0 : transfer.time()));
    }
    if (in.op == InstrOp::Vocab) {
      const double d = costs.vocab[static_cast<size_t>(in.vocab)];
      events[r].push_back({Action{}, rank, start, start + d, to_string(in)});
      now[r] = start + d;
      out.busy[r] += d;
      return;
    }
    const double d = costs.of(in.action);
    const double end = link.compute(rank, in, start, d);
    events[r].push_back({in.action, rank, start, end, {}});
    now[r] = end;
    out.busy[r] += d;
    const std::pair<int, int> cell{in.action.microbatch, in.action.stage};
    if (in.action.op == Op::F) live[r].insert(cell);
    out.peak_inflight[r] = std::max(out.peak_inflight[r], static_cast<int>(live[r].size()));
    if (in.frees_stash) live[r].erase(cell);
  });
  for (size_t r = 0; r < R; ++r) {
    if (next[r] < p.per_rank[r].size()) fail("simulate_program: {} does not make progress (validate it first)", p.name);
    out.makespan = std::max({out.makespan, now[r], link.free_at(static_cast<int>(r))});
    out.events.insert(out.events.end(), events[r].begin(), events[r].end());
  }
  out.link_events = std::move(link.events);
  double busy = 0;
  for (double b : out.busy) busy += b;
  out.bubble_fraction = out.makespan > 0 ? 1.0 - busy / (static_cast<double>(R) * out.makespan) : 0.0;
  return out;
}

}  // namespace pipetrain
