// place_shard_collectives() and validate_shards() (pipetrain/schedule/shard_pass.hpp).
#include "pipetrain/schedule/shard_pass.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <set>

#include "pipetrain/core/error.hpp"

namespace pipetrain {

namespace {

// One layer of work: layer `layer` of the compute at `instr` in the rank's list.
struct Work {
  size_t instr = 0;
  int layer = 0;
  bool reads = false, writes = false;  // the weights; the gradient
  const std::vector<UnitRef>* units = nullptr;
};

std::string unit_name(const UnitRef& u) { return fmt::format("{}.{}", u.stage, u.unit); }

const std::vector<std::vector<UnitRef>>& layers_of(const Program& p, const ShardUnits& u, int rank, int stage) {
  if (static_cast<size_t>(rank) >= u.layers.size())
    fail("program {}: the shard units describe {} ranks, the program has {}", p.name, u.layers.size(), p.num_ranks);
  const auto& by_stage = u.layers[static_cast<size_t>(rank)];
  const auto it = by_stage.find(stage);
  if (it == by_stage.end())
    fail("program {}: rank {} runs stage {}, which its shard units do not list", p.name, rank, stage);
  return it->second;
}

// The layers a compute runs, in the order it runs them, and what each does to its units.
std::vector<Work> work_of(const Program& p, const ShardUnits& u, int rank, size_t i) {
  const Action& a = p.per_rank[static_cast<size_t>(rank)][i].action;
  const auto& layers = layers_of(p, u, rank, a.stage);
  const int n = static_cast<int>(layers.size());
  std::vector<Work> out;
  for (int j = 0; j < n; ++j) {
    const int k = a.op == Op::F ? j : n - 1 - j;
    out.push_back({i, k, a.op != Op::W, p.backward && a.op != Op::F, &layers[static_cast<size_t>(k)]});
  }
  return out;
}

// An overlapped pair's computes: [first, second] of the pair holding compute i, or {i, i}.
std::pair<size_t, size_t> pair_around(const std::vector<Instr>& prog, size_t i) {
  auto next_compute = [&](size_t j) {
    for (++j; j < prog.size() && prog[j].op != InstrOp::Compute; ++j) {
    }
    return j;
  };
  if (prog[i].overlaps_next) return {i, next_compute(i)};
  for (size_t j = i; j-- > 0;)
    if (prog[j].op == InstrOp::Compute) return prog[j].overlaps_next ? std::pair{j, i} : std::pair{i, i};
  return {i, i};
}

struct Placed {
  ShardOp op;
  UnitRef unit;
  size_t work;  // before that work (a gather) or after it (a free, a reduce-scatter)
};

// Where an instruction placed at a work lands: inside its compute, or, in an overlapped pair,
// before the pair (a gather) or after it (the rest). first[w] / last[w]: the first and last
// work the instruction may run beside.
struct Snap {
  std::vector<size_t> first, last;
};

// The gathers and frees of one unit read at work indices `reads` (ascending): its windows,
// each gathered `prefetch` works ahead; a window whose gather would land before the last
// one's free joins it.
void place_weights(const std::vector<size_t>& reads, const UnitRef& u, const ShardPlacement& o, const Snap& snap,
                   std::vector<Placed>& out) {
  const auto gather_at = [&](size_t first) { return first - std::min<size_t>(first, static_cast<size_t>(o.prefetch)); };
  std::vector<std::pair<size_t, size_t>> windows;
  for (size_t w : reads) {
    const bool joins = !windows.empty() && (o.keep || snap.first[gather_at(w)] <= snap.last[windows.back().second] ||
                                            gather_at(w) <= windows.back().second + 1);
    if (joins)
      windows.back().second = w;
    else
      windows.push_back({w, w});
  }
  for (const auto& [first, last] : windows) {
    out.push_back({ShardOp::GatherW, u, gather_at(first)});
    out.push_back({ShardOp::FreeW, u, last});
  }
}

std::vector<Instr> place_on_rank(const Program& p, const ShardUnits& units, const ShardPlacement& o, int rank) {
  const auto& prog = p.per_rank[static_cast<size_t>(rank)];
  std::vector<Work> work;
  std::map<size_t, std::pair<size_t, size_t>> works_of;  // compute -> its works [first, last]
  for (size_t i = 0; i < prog.size(); ++i)
    if (prog[i].op == InstrOp::Compute) {
      const auto w = work_of(p, units, rank, i);
      works_of[i] = {work.size(), work.size() + w.size() - 1};
      work.insert(work.end(), w.begin(), w.end());
    }
  Snap snap;
  for (const Work& w : work) {
    const auto [first, second] = pair_around(prog, w.instr);
    snap.first.push_back(first == second ? snap.first.size() : works_of.at(first).first);
    snap.last.push_back(first == second ? snap.last.size() : works_of.at(second).second);
  }
  std::map<UnitRef, std::vector<size_t>> reads;
  std::map<UnitRef, size_t> last_write;
  for (size_t w = 0; w < work.size(); ++w)
    for (const UnitRef& u : *work[w].units) {
      if (work[w].reads) reads[u].push_back(w);
      if (work[w].writes) last_write[u] = w;
    }
  std::vector<Placed> placed;
  if (o.weights)
    for (const auto& [u, ws] : reads) place_weights(ws, u, o, snap, placed);
  if (o.gradients)
    for (const auto& [u, w] : last_write) placed.push_back({ShardOp::ReduceScatterG, u, w});
  // In the order they run: by work, a work's gather before it and the rest after it.
  std::stable_sort(placed.begin(), placed.end(), [](const Placed& a, const Placed& b) {
    const bool a_after = a.op != ShardOp::GatherW, b_after = b.op != ShardOp::GatherW;
    return std::tie(a.work, a_after) < std::tie(b.work, b_after);
  });
  std::map<size_t, std::vector<Instr>> before, inside, after;  // by the compute's index
  for (const Placed& x : placed) {
    const Work& w = work[x.work];
    Instr in;
    in.op = InstrOp::Shard;
    in.shard = x.op;
    in.stage = x.unit.stage;
    in.unit = x.unit.unit;
    const auto [first, second] = pair_around(prog, w.instr);
    // A gather for a compute's first layer is posted before the compute, so it travels
    // while the compute waits for its input.
    const bool opens = x.op == ShardOp::GatherW && works_of.at(w.instr).first == x.work;
    if (first == second && !opens) {
      in.at_layer = w.layer;
      inside[w.instr].push_back(in);
    } else if (x.op == ShardOp::GatherW) {
      before[first].push_back(in);
    } else {
      after[second].push_back(in);
    }
  }
  std::vector<Instr> out;
  for (size_t i = 0; i < prog.size(); ++i) {
    if (before.count(i)) out.insert(out.end(), before[i].begin(), before[i].end());
    out.push_back(prog[i]);
    if (inside.count(i)) out.insert(out.end(), inside[i].begin(), inside[i].end());
    if (after.count(i)) out.insert(out.end(), after[i].begin(), after[i].end());
  }
  return out;
}

}  // namespace

ShardUnits uniform_units(const Schedule& s, int layers) {
  ShardUnits u;
  u.layers.resize(static_cast<size_t>(s.num_ranks));
  u.elems.resize(static_cast<size_t>(s.num_ranks));
  for (int st = 0; st < s.num_stages; ++st) {
    const auto r = static_cast<size_t>(s.stage_to_rank[static_cast<size_t>(st)]);
    for (int k = 0; k < layers; ++k) {
      u.layers[r][st].push_back({UnitRef{st, k}});
      u.elems[r][UnitRef{st, k}] = 1;
    }
  }
  return u;
}

Program place_shard_collectives(Program p, const ShardUnits& units, const ShardPlacement& placement) {
  if (!placement.any()) return p;
  if (placement.prefetch < 0) fail("program {}: a prefetch of {} layers (at least 0)", p.name, placement.prefetch);
  std::vector<std::vector<Instr>> lists;
  for (int r = 0; r < p.num_ranks; ++r) lists.push_back(place_on_rank(p, units, placement, r));
  p.per_rank = std::move(lists);
  p.stage_layers.assign(static_cast<size_t>(p.num_stages), 0);
  for (int s = 0; s < p.num_stages; ++s) {
    const int r = p.stage_to_rank[static_cast<size_t>(s)];
    p.stage_layers[static_cast<size_t>(s)] = static_cast<int>(layers_of(p, units, r, s).size());
  }
  return p;
}

namespace {

// One rank's replay of its list under the shard rules.
class ShardReplay {
 public:
  ShardReplay(const Program& p, const ShardUnits& units, const ShardPlacement& o, int rank)
      : p_(p), units_(units), o_(o), rank_(rank), prog_(p.per_rank[static_cast<size_t>(rank)]) {}

  ShardPeak run() {
    for (size_t i = 0; i < prog_.size(); ++i) {
      const Instr& in = prog_[i];
      if (in.op == InstrOp::Shard) {
        if (in.at_layer >= 0) at(i, "runs inside a compute, but no compute comes right before it");
        apply(i);
      } else if (in.op == InstrOp::Compute) {
        i = compute(i);
      }
    }
    for (const auto& [u, where] : gathered_)
      at(where, fmt::format("unit {} stays gathered at the end of the step (no FREE_W follows)", unit_name(u)));
    if (o_.gradients && p_.backward)
      for (const auto& [u, where] : open_)
        at(where, fmt::format("the gradient of unit {} is never reduce-scattered", unit_name(u)));
    return peak_;
  }

 private:
  [[noreturn]] void at(size_t i, const std::string& what) const {
    fail("rank {}, position {} ({}): {}", rank_, program_position(p_, rank_, i), to_string(prog_[i]), what);
  }
  int64_t elems(const UnitRef& u) const {
    const auto& m = units_.elems[static_cast<size_t>(rank_)];
    const auto it = m.find(u);
    return it == m.end() ? 0 : it->second;
  }

  // The compute at i and the instructions inside it; returns the last index it covers.
  size_t compute(size_t i) {
    size_t end = i + 1;
    while (end < prog_.size() && prog_[end].op == InstrOp::Shard && prog_[end].at_layer >= 0) ++end;
    const auto [first, second] = pair_around(prog_, i);
    if (first != second && end > i + 1)
      at(i + 1,
         "stands inside an overlapped pair, whose halves interleave by data arrival: data-parallel ranks could post "
         "it in different orders");
    size_t q = i + 1;
    for (const Work& w : work_of(p_, units_, rank_, i)) {
      while (q < end && prog_[q].at_layer == w.layer && prog_[q].shard == ShardOp::GatherW) apply(q++);
      touch(i, w);
      while (q < end && prog_[q].at_layer == w.layer && prog_[q].shard != ShardOp::GatherW) apply(q++);
    }
    if (q < end) at(q, fmt::format("names a layer its compute ({}) does not run at that point", to_string(prog_[i])));
    return end - 1;
  }

  void touch(size_t i, const Work& w) {
    for (const UnitRef& u : *w.units) {
      if (w.reads && o_.weights && !gathered_.count(u)) {
        const auto f = freed_.find(u);
        at(i, fmt::format("its layer {} reads unit {}, which is not gathered here{}", w.layer, unit_name(u),
                          f == freed_.end()
                              ? ""
                              : fmt::format(" (freed at position {})", program_position(p_, rank_, f->second))));
      }
      if (!w.writes || !o_.gradients) continue;
      if (const auto s = scattered_.find(u); s != scattered_.end())
        at(i, fmt::format("its layer {} writes the gradient of unit {} after its REDUCE_SCATTER_G (position {})",
                          w.layer, unit_name(u), program_position(p_, rank_, s->second)));
      if (open_.emplace(u, i).second) add(grads_, peak_.gradients, elems(u));
    }
  }

  void apply(size_t i) {
    const Instr& in = prog_[i];
    const UnitRef u{in.stage, in.unit};
    switch (in.shard) {
      case ShardOp::GatherW:
        if (!o_.weights) at(i, "a weight gather, but the weights are not sharded");
        if (gathered_.count(u))
          at(i, fmt::format("unit {} is already gathered (position {})", unit_name(u),
                            program_position(p_, rank_, gathered_[u])));
        gathered_[u] = i;
        add(weights_, peak_.weights, elems(u));
        return;
      case ShardOp::FreeW:
        if (!gathered_.erase(u)) at(i, fmt::format("unit {} is not gathered", unit_name(u)));
        freed_[u] = i;
        weights_ -= elems(u);
        return;
      case ShardOp::ReduceScatterG:
        if (!o_.gradients) at(i, "a gradient reduce-scatter, but the gradients are not sharded");
        if (scattered_.count(u))
          at(i, fmt::format("unit {} was reduce-scattered already this step (position {})", unit_name(u),
                            program_position(p_, rank_, scattered_[u])));
        if (!open_.erase(u)) at(i, fmt::format("no work wrote the gradient of unit {} before it", unit_name(u)));
        scattered_[u] = i;
        scatter(u);
        return;
    }
  }
  // The unit's gradient stays (as the copies its reduce-scatter sends) until the
  // reduce-scatter ends: at the latest when kScattersInFlight newer ones are posted (the
  // runtime waits for it then).
  void scatter(const UnitRef& u) {
    peak_.gradients = std::max(peak_.gradients, grads_ + elems(u));  // its chunks copied while it is whole
    peak_.together = std::max(peak_.together, weights_ + grads_ + elems(u));
    in_flight_.push_back(u);
    add(flying_, peak_.in_flight, elems(u));
    if (in_flight_.size() <= static_cast<size_t>(kScattersInFlight)) return;
    const int64_t n = elems(in_flight_.front());
    in_flight_.pop_front();
    flying_ -= n;
    grads_ -= n;
  }
  void add(int64_t& now, int64_t& peak, int64_t n) {
    now += n;
    peak = std::max(peak, now);
    peak_.together = std::max(peak_.together, weights_ + grads_);
  }

  const Program& p_;
  const ShardUnits& units_;
  const ShardPlacement& o_;
  int rank_;
  const std::vector<Instr>& prog_;
  std::map<UnitRef, size_t> gathered_, freed_, open_, scattered_;  // -> the position that did it
  int64_t weights_ = 0, grads_ = 0, flying_ = 0;
  std::deque<UnitRef> in_flight_;
  ShardPeak peak_;
};

}  // namespace

std::vector<ShardPeak> validate_shards(const Program& p, const ShardUnits& units, const ShardPlacement& placement) {
  std::vector<ShardPeak> out;
  for (int r = 0; r < p.num_ranks; ++r) out.push_back(ShardReplay(p, units, placement, r).run());
  return out;
}

}  // namespace pipetrain
