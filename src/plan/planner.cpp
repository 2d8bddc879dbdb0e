// plan(), predict() and their helpers (pipetrain/plan/planner.hpp).
#include "pipetrain/plan/planner.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <tuple>

#include "layout_cost.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/core/grid_rules.hpp"
#include "pipetrain/model/partition.hpp"
#include "pipetrain/model/stage.hpp"
#include "pipetrain/plan/run_plan.hpp"
#include "pipetrain/plan/shard_plan.hpp"
#include "pipetrain/plan/vocab_choice.hpp"
#include "pipetrain/plan/vocab_memory.hpp"
#include "pipetrain/schedule/program.hpp"
#include "pipetrain/schedule/registry.hpp"
#include "pipetrain/schedule/simulate.hpp"
#include "pipetrain/schedule/vocab_pieces.hpp"

namespace pipetrain {

std::vector<int> peak_stashes(const Schedule& s) {
  std::vector<int> peak(static_cast<size_t>(s.num_ranks), 0);
  for (size_t r = 0; r < s.per_rank.size(); ++r) {
    int live = 0;
    for (const Action& a : s.per_rank[r]) {
      if (a.op == Op::F) peak[r] = std::max(peak[r], ++live);
      if (a.op == Op::B || a.op == Op::W) --live;  // the stash goes with its last backward action
    }
  }
  return peak;
}

namespace {

// The schedules, built once per (name, ranks, stages per rank, microbatches) and shared by
// every layout that runs them, and their lowered programs.
using ScheduleKey = std::tuple<std::string, int, int, int>;

class ScheduleCache {
 public:
  Built& get(const std::string& name, int pp, int v, int m) {
    auto& b = cache_[ScheduleKey{name, pp, v, m}];
    if (!b) {
      b = std::make_unique<Built>();
      try {
        b->schedule = make_schedule(name, ScheduleParams{pp, v, m});
        b->peaks = peak_stashes(b->schedule);
        b->stash_points = stash_points(b->schedule);
        b->ok = true;
      } catch (const Error&) {
        b->ok = false;  // the schedule cannot take these parameters
      }
    }
    return *b;
  }
  // The program a layout runs: the trainer's (program_builder.hpp), the slices placed by
  // its rule.
  const Program& program(Built& b, const ModelConfig& model, const Layout& l) {
    const ProgramRecipe recipe = program_recipe(model, l, b.schedule.num_stages, INT_MAX, false);
    auto& built = l.vocab_parallel ? b.vocab_programs[l.tp] : b.program;
    if (!built) built = std::make_unique<Program>(build_program(b.schedule, recipe));
    return *built;
  }

 private:
  std::map<ScheduleKey, std::unique_ptr<Built>> cache_;
};

// Sharded data parallelism: the units the layout's program holds whole at most (its shard
// collectives placed on its split), in place of the bound that pruned.
RankMemory sharded_memory(const Context& cx, const Costed& k) {
  const ModelConfig& model = cx.cfg.model;
  const Layout& l = k.layout;
  const Schedule& s = k.built->schedule;
  ProgramRecipe recipe = program_recipe(model, l, s.num_stages, INT_MAX, false);
  recipe.shard = shard_placement(l);
  const auto split = stage_split(model, s.num_stages, l.blocks_per_stage, l.vocab_parallel, UnitCosts{});
  recipe.units = shard_units(model, l, s, split);
  const Program prog = build_program(s, recipe);
  RankMemory largest;
  for (int r = 0; r < prog.num_ranks; ++r) {
    MemoryInputs in = k.inputs[static_cast<size_t>(r)];
    in.whole_weights = static_cast<double>(prog.shard_peak[static_cast<size_t>(r)].weights);
    in.whole_gradients = static_cast<double>(prog.shard_peak[static_cast<size_t>(r)].gradients);
    in.in_flight = static_cast<double>(prog.shard_peak[static_cast<size_t>(r)].in_flight);
    in.whole_together = static_cast<double>(prog.shard_peak[static_cast<size_t>(r)].together);
    const RankMemory mem = rank_memory(in);
    if (mem.total() > largest.total()) largest = mem;
  }
  return largest;
}

// cost_layout, with the memory a level's placed program holds where the level places
// collectives (the bound before placement can be below it).
Costed cost_placed(const Context& cx, const Layout& l, Built& b) {
  Costed k = cost_layout(cx, l, b);
  if (l.shard >= ShardLevel::Gradients) k.memory = sharded_memory(cx, k);
  return k;
}

Prediction simulate_layout(const Context& cx, ScheduleCache& cache, Costed& k) {
  const bool vp = k.layout.vocab_parallel;
  const Program& prog = cache.program(*k.built, cx.cfg.model, k.layout);
  const SimResult sim = simulate_program(prog, k.costs, TransferCosts{0, 0, k.transfer});
  std::vector<double> end(static_cast<size_t>(prog.num_ranks), 0.0);
  for (const SimEvent& e : sim.events)
    end[static_cast<size_t>(e.rank)] = std::max(end[static_cast<size_t>(e.rank)], e.end);
  Prediction p;
  for (int r = 0; r < prog.num_ranks; ++r) {
    const auto i = static_cast<size_t>(r);
    const double step = end[i] + k.dp[i] + k.optimizer[i] + k.other[i];
    if (step <= p.step_s) continue;
    p.step_s = step;
    p.critical_rank = r;
    p.tp_comm_s = k.tp_comm[i];
    p.ep_comm_s = k.ep_comm[i];
    p.cp_comm_s = k.cp_comm[i];
    p.compute_s = k.busy[i] - k.tp_comm[i] - k.ep_comm[i] - k.cp_comm[i];
    p.bubble_s = end[i] - k.busy[i];
    p.dp_s = k.dp[i];
    p.optimizer_s = k.optimizer[i];
    p.other_s = k.other[i];
  }
  const ModelConfig& model = cx.cfg.model;
  const int T = cx.cfg.train.seq_len;
  const double params = model_params(model);
  p.tokens_per_s = static_cast<double>(cx.global_batch) * T / p.step_s;
  p.flops_per_device = model_flops_per_token(model, static_cast<int64_t>(params), T) * p.tokens_per_s / cx.devices;
  p.mfu = p.flops_per_device / cx.cluster.device.peak_flops.at(k.layout.precision);
  p.memory = k.memory;
  if (vp) {  // the placed program's own stashes and slices, in place of the bound that pruned
    p.memory = RankMemory{};
    const DType storage = k.layout.precision == "bf16" ? DType::BF16 : DType::F32;
    const std::vector<int> peaks = simulate_program(prog, Costs{}).peak_inflight;  // stashes: times do not matter
    for (int r = 0; r < prog.num_ranks; ++r) {
      MemoryInputs in = k.inputs[static_cast<size_t>(r)];
      add_vocab_memory(prog, r, peaks[static_cast<size_t>(r)], model, k.layout.pp * k.layout.tp,
                       k.layout.microbatch_size, T / k.layout.cp, storage, in);  // a rank's tokens
      const RankMemory mem = rank_memory(in);
      if (mem.total() > p.memory.total()) p.memory = mem;
    }
  }
  return p;
}

// Whether x is among `only` (a --tp, --pp, --ep, --cp restriction; empty: any).
bool allowed(const std::vector<int>& only, int x) {
  return only.empty() || std::find(only.begin(), only.end(), x) != only.end();
}

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

// parallel.ep for a grid: every divisor of its dp the expert rules allow (1 without
// experts).
std::vector<int> ep_options(const ModelConfig& model, GridShape grid) {
  std::vector<int> out;
  for (int ep : divisors(grid.dp)) {
    grid.ep = ep;
    if (expert_parallel_problem(model, grid).empty()) out.push_back(ep);
  }
  return out;
}

// parallel.cp for a grid's dp x cp ranks (cp must divide them and leave dp dividing the
// batch): 1, and every cp the context-parallel rules allow that leaves each rank
// kMinRingChunk tokens or more.
std::vector<int> cp_options(const Config& cfg, int ranks) {
  std::vector<int> out;
  const int T = cfg.train.seq_len;
  for (int cp : divisors(ranks))
    if (cp == 1 || (context_parallel_problem(cfg.model, T, cp).empty() && T / cp >= kMinRingChunk)) out.push_back(cp);
  return out;
}

std::string gib(double bytes) { return fmt::format("{:.1f} GiB", bytes / (1024.0 * 1024.0 * 1024.0)); }

// Steps within 0.1% are a tie: fewer, bigger microbatches first (the model's rates are
// per FLOP; real products gain from size), then less memory.
bool faster(const std::pair<Layout, Prediction>& a, const std::pair<Layout, Prediction>& b) {
  if (std::abs(a.second.step_s - b.second.step_s) > 1e-3 * std::min(a.second.step_s, b.second.step_s))
    return a.second.step_s < b.second.step_s;
  if (a.first.microbatches != b.first.microbatches) return a.first.microbatches < b.first.microbatches;
  return a.second.memory.total() < b.second.memory.total();
}

// The component that makes the first faster than the second.
std::string reason(const Prediction& a, const Prediction& b, const Layout& second) {
  const std::pair<const char*, double> parts[] = {{"pipeline bubble", b.bubble_s - a.bubble_s},
                                                  {"tensor-parallel communication", b.tp_comm_s - a.tp_comm_s},
                                                  {"expert all-to-all", b.ep_comm_s - a.ep_comm_s},
                                                  {"context-parallel ring", b.cp_comm_s - a.cp_comm_s},
                                                  {"compute (recomputation, kernel sizes)", b.compute_s - a.compute_s},
                                                  {"data-parallel tail", b.dp_s - a.dp_s},
                                                  {"optimizer step", b.optimizer_s - a.optimizer_s},
                                                  {"tied-embedding exchange", b.other_s - a.other_s}};
  const auto* best = &parts[0];
  for (const auto& x : parts)
    if (x.second > best->second) best = &x;
  if (b.step_s - a.step_s <= 1e-3 * a.step_s)
    return fmt::format(
        "a tie with the runner-up ({}, step {:.1f} ms) within 0.1%: fewer microbatches, then less "
        "memory, decide",
        describe(second), 1e3 * b.step_s);
  return fmt::format("{} {:.1f} ms shorter than in the runner-up ({}, step {:.1f} ms)", best->first, 1e3 * best->second,
                     describe(second), 1e3 * b.step_s);
}

}  // namespace

std::string describe(const Layout& l) {
  std::string sched = l.pp == 1 ? "no pipeline" : l.schedule;
  if (l.pp > 1 && l.virtual_stages > 1) sched += fmt::format(" (v {})", l.virtual_stages);
  std::string shard = l.shard >= ShardLevel::Gradients ? fmt::format("shard {}", to_string(l.shard))
                                                       : fmt::format("ZeRO-1 {}", l.zero1 ? "on" : "off");
  if (l.shard == ShardLevel::Weights)
    shard += l.shard_keep ? " (keep)" : fmt::format(" (regather, prefetch {})", l.shard_prefetch);
  return fmt::format("dp {} x pp {} x {}tp {}{}, {}, {} x {} seq, recompute {}, {}, {}{}{}", l.dp, l.pp,
                     l.cp > 1 ? fmt::format("cp {} x ", l.cp) : "", l.tp, l.ep > 1 ? fmt::format(" (ep {})", l.ep) : "",
                     sched, l.microbatches, l.microbatch_size, to_string(l.recompute), shard, l.precision,
                     l.vocab_parallel ? ", vocabulary parallel" : "", l.sequence_parallel ? ", sequence parallel" : "");
}

Layout layout_of(const Config& cfg) {
  Layout l;
  static_cast<GridShape&>(l) = cfg.parallel;
  l.virtual_stages = cfg.parallel.virtual_stages;
  l.schedule = cfg.schedule.name;
  l.microbatches = cfg.train.microbatches;
  l.microbatch_size = cfg.train.global_batch / std::max(1, cfg.parallel.dp * cfg.train.microbatches);
  l.recompute = parse_recompute(cfg.train.recompute);
  l.shard = cfg.parallel.replicas() > 1 ? shard_level(cfg.parallel) : ShardLevel::None;
  l.zero1 = l.shard >= ShardLevel::Optimizer;
  l.shard_keep = cfg.parallel.shard_reuse == "keep";
  l.shard_prefetch = cfg.parallel.shard_prefetch;
  l.shard_group = l.shard >= ShardLevel::Gradients ? cfg.parallel.shard_group : 0;
  l.precision = cfg.train.precision;
  l.vocab_parallel = choose_vocab_parallel(cfg).on;
  l.sequence_parallel = sequence_parallel_on(cfg);
  return l;
}

std::vector<std::string> with_planning_layout(const std::vector<std::string>& overrides) {
  std::vector<std::string> all = {"parallel.dp=1",
                                  "parallel.pp=1",
                                  "parallel.tp=1",
                                  "parallel.ep=1",
                                  "parallel.cp=1",
                                  "parallel.virtual_stages=1",
                                  "parallel.layers_per_stage=auto",
                                  "parallel.recompute_stages=all",
                                  "train.microbatches=1"};
  all.insert(all.end(), overrides.begin(), overrides.end());
  return all;
}

Config planned_config(const std::string& path, const std::vector<std::string>& overrides, const ClusterSpec& cluster,
                      int ranks, std::string* note) {
  const Config neutral = load_config(path, with_planning_layout(overrides));
  PlanOptions po;
  po.devices = ranks;
  po.precisions = {neutral.train.precision};
  po.top = 2;
  po.dp_bucket_mb = neutral.parallel.dp_bucket_mb;
  const PlanResult best = plan(neutral, cluster, po);
  std::vector<std::string> chosen = overrides;
  for (const auto& o : layout_overrides(best.ranked.front().first)) chosen.push_back(o);
  Config cfg = load_config(path, chosen);
  cfg.schedule.file.clear();  // the plan's schedule, not a file's
  if (note)
    *note = fmt::format(" auto (best of {} layouts, {} pruned for memory{})", best.candidates, best.pruned_memory,
                        best.reason.empty() ? "" : "; " + best.reason);
  return cfg;
}

std::vector<std::string> layout_overrides(const Layout& l) {
  std::vector<std::string> out = {fmt::format("parallel.dp={}", l.dp),
                                  fmt::format("parallel.pp={}", l.pp),
                                  fmt::format("parallel.tp={}", l.tp),
                                  fmt::format("parallel.ep={}", l.ep),
                                  fmt::format("parallel.cp={}", l.cp),
                                  fmt::format("parallel.virtual_stages={}", l.virtual_stages),
                                  "parallel.layers_per_stage=auto",
                                  fmt::format("parallel.zero1={}", l.zero1 ? "true" : "false"),
                                  fmt::format("parallel.shard={}", to_string(l.shard)),
                                  fmt::format("parallel.shard_group={}", l.shard_group),
                                  fmt::format("schedule.name={}", l.schedule),
                                  fmt::format("train.microbatches={}", l.microbatches),
                                  fmt::format("train.global_batch={}", l.dp * l.microbatches * l.microbatch_size),
                                  fmt::format("train.recompute={}", to_string(l.recompute)),
                                  fmt::format("train.precision={}", l.precision),
                                  fmt::format("parallel.vocab_parallel={}", l.vocab_parallel ? "true" : "false"),
                                  fmt::format("parallel.sequence_parallel={}", l.sequence_parallel ? "true" : "false")};
  if (l.shard == ShardLevel::Weights) {
    out.push_back(fmt::format("parallel.shard_reuse={}", l.shard_keep ? "keep" : "regather"));
    out.push_back(fmt::format("parallel.shard_prefetch={}", l.shard_prefetch));
  }
  return out;
}

Prediction predict(const Config& cfg, const ClusterSpec& cluster, Layout& layout, int global_batch) {
  const int devices = layout.dp * layout.pp * layout.cp * layout.tp;
  Context cx{cfg, cluster, devices,
             global_batch > 0 ? global_batch : layout.dp * layout.microbatches * layout.microbatch_size,
             cfg.parallel.dp_bucket_mb * 1048576.0};
  if (!cluster.device.peak_flops.count(layout.precision))
    fail("{}: the device has no peak for {} (device.peak_tflops.{})", cluster.source, layout.precision,
         layout.precision);
  ScheduleCache cache;
  Built& b =
      cache.get(layout.pp == 1 ? "1f1b" : layout.schedule, layout.pp, layout.virtual_stages, layout.microbatches);
  if (!b.ok)
    fail("schedule {} cannot run {} ranks x {} stages, {} microbatches", layout.schedule, layout.pp,
         layout.virtual_stages, layout.microbatches);
  Costed k = cost_placed(cx, layout, b);
  layout.blocks_per_stage = k.layout.blocks_per_stage;
  return simulate_layout(cx, cache, k);
}

// parallel.vocab_parallel for a grid: false and true as set (true only where the grid
// can take the slices), both under "auto" where there is a pipeline to balance.
std::vector<bool> vocab_options(const Context& cx, const Layout& l) {
  const Toggle t = cx.cfg.parallel.vocab_parallel;
  if (t == Toggle::Off) return {false};
  Config c = cx.cfg;
  c.parallel.pp = l.pp, c.parallel.tp = l.tp, c.parallel.cp = l.cp, c.runtime.device = cx.cluster.device.kind;
  const bool can = vocab_parallel_problem(c).empty();
  if (t == Toggle::On) return can ? std::vector<bool>{true} : std::vector<bool>{};
  return can && l.pp > 1 ? std::vector<bool>{false, true} : std::vector<bool>{false};
}

// The shard levels a search tries (PlanOptions::shard).
// The levels tried: --shard's; else ZeRO-1 off and on (--zero1), and where ZeRO-1 may be on
// and the grid rules let the model run them on the cluster's device the gradients' and the
// weights' too; the config's own level always.
std::vector<ShardLevel> shard_levels(const Context& cx, const PlanOptions& o) {
  if (!o.shard.empty()) return o.shard;
  std::vector<ShardLevel> out;
  for (bool z : o.zero1) out.push_back(z ? ShardLevel::Optimizer : ShardLevel::None);
  Config probe = cx.cfg;
  probe.parallel.shard = "weights", probe.parallel.zero1 = true;
  probe.runtime.device = cx.cluster.device.kind, probe.runtime.pack_weights = Toggle::Auto;
  const bool zero1 = std::find(o.zero1.begin(), o.zero1.end(), true) != o.zero1.end();
  if (zero1 && shard_problem(probe).empty()) out.insert(out.end(), {ShardLevel::Gradients, ShardLevel::Weights});
  if (const ShardLevel asked = shard_level(cx.cfg.parallel);
      asked >= ShardLevel::Gradients && std::find(out.begin(), out.end(), asked) == out.end())
    out.push_back(asked);
  return out;
}

// Under "weights", the windows tried: each unit regathered for every run of work with its
// gather posted one layer of work ahead or none (a layer less held), or kept for the step
// (gathered once); one placement for the other levels.
std::vector<std::pair<bool, int>> weight_windows(ShardLevel level) {
  if (level != ShardLevel::Weights) return {{false, 1}};
  return {{false, 1}, {false, 0}, {true, 1}};
}

// One layout: costed, kept in `fits` where it fits in memory, and the smallest of all
// remembered for the error that none fits.
void add_variant(const Context& cx, const Layout& v, Built& b, PlanResult& res, std::vector<Costed>& fits) {
  ++res.candidates;
  Costed k = cost_placed(cx, v, b);
  const double need = k.memory.total() + cx.cluster.device.reserve_bytes;
  if (res.smallest_memory == 0 || need < res.smallest_memory) res.smallest = k.layout, res.smallest_memory = need;
  if (k.memory.total() > res.usable_memory) {
    ++res.pruned_memory;
    return;
  }
  fits.push_back(std::move(k));
}

// The layout `l` (its grid, schedule and microbatches set) in each precision, recompute
// mode, shard level (and its windows) and vocabulary-parallel setting asked for.
void add_variants(const Context& cx, const PlanOptions& o, const std::vector<std::string>& precisions, const Layout& l,
                  Built& b, PlanResult& res, std::vector<Costed>& fits) {
  const std::vector<bool> vocab = vocab_options(cx, l);
  for (const auto& prec : precisions)
    for (const auto& rc : o.recompute)
      for (ShardLevel level : shard_levels(cx, o))
        for (bool vp : vocab) {
          if (level != ShardLevel::None && l.dp * l.cp == 1) continue;
          if (level >= ShardLevel::Gradients && vp) continue;  // (the slices are not sharded yet)
          Layout v = l;
          v.recompute = parse_recompute(rc), v.shard = level, v.zero1 = level >= ShardLevel::Optimizer;
          v.shard_group = 0;
          v.precision = prec, v.vocab_parallel = vp;
          for (const auto& [keep, prefetch] : weight_windows(level)) {
            v.shard_keep = keep, v.shard_prefetch = prefetch;
            add_variant(cx, v, b, res, fits);
          }
        }
}

// Every layout of one grid (dp, pp, cp, tp set): microbatches, schedules with their virtual
// stages, ep, then add_variants' settings.
void add_grid(const Context& cx, const PlanOptions& o, const std::vector<std::string>& precisions,
              const std::vector<std::string>& schedules, const Layout& grid, ScheduleCache& cache, PlanResult& res,
              std::vector<Costed>& fits) {
  const Config& cfg = cx.cfg;
  const int pp = grid.pp, per_replica = res.global_batch / grid.dp;
  for (int m : divisors(per_replica))
    for (const auto& name : pp == 1 ? std::vector<std::string>{"1f1b"} : schedules)
      for (int v = 1; v <= (pp == 1 ? 1 : o.max_virtual_stages); v *= 2) {
        if (!stage_split_problem(cfg.model, int64_t{pp} * v).empty()) break;
        if (pp > 1 && !allowed(o.only_virtual, v)) continue;
        Built& b = cache.get(name, pp, v, m);
        if (!b.ok) continue;
        for (int ep : ep_options(cfg.model, grid)) {
          if (!allowed(o.only_ep, ep)) continue;
          Layout l = grid;
          l.ep = ep, l.virtual_stages = v, l.schedule = name;
          // "true" where tp does not divide a rank's tokens: the layout without it
          l.sequence_parallel =
              sequence_parallel_on(Toggle::Auto, l, cfg.train.seq_len) && cfg.parallel.sequence_parallel != Toggle::Off;
          l.microbatches = m, l.microbatch_size = per_replica / m;
          add_variants(cx, o, precisions, l, b, res, fits);
        }
      }
}

// Branch and bound: simulate the layouts that fit in the order of their lower bound (no
// bubble) and stop once it cannot beat the current k-th best.
void rank_fits(const Context& cx, ScheduleCache& cache, const PlanOptions& o, std::vector<Costed>& fits,
               PlanResult& res) {
  std::sort(fits.begin(), fits.end(), [](const Costed& a, const Costed& b) { return a.lower_bound < b.lower_bound; });
  const size_t keep = static_cast<size_t>(std::max(o.top, 2));
  for (auto& k : fits) {
    if (res.ranked.size() >= keep && k.lower_bound >= res.ranked.back().second.step_s) break;
    Prediction p = simulate_layout(cx, cache, k);
    ++res.simulated;
    res.ranked.emplace_back(k.layout, p);
    std::stable_sort(res.ranked.begin(), res.ranked.end(), faster);
    if (res.ranked.size() > keep) res.ranked.pop_back();
  }
}

PlanResult plan(const Config& cfg, const ClusterSpec& cluster, const PlanOptions& o) {
  const ModelConfig& model = cfg.model;
  PlanResult res;
  const int nodes = o.nodes > 0 ? o.nodes : cluster.nodes;
  res.devices = o.devices > 0 ? o.devices : nodes * cluster.devices_per_node;
  res.global_batch = o.global_batch > 0 ? o.global_batch : cfg.train.global_batch;
  res.usable_memory = cluster.device.memory_bytes - cluster.device.reserve_bytes;
  const int per_node = std::min(cluster.devices_per_node, res.devices);
  Context cx{cfg, cluster, res.devices, res.global_batch, o.dp_bucket_mb * 1048576.0};

  std::vector<std::string> precisions = o.precisions, schedules = o.schedules;
  if (precisions.empty())
    for (const auto& [p, v] : cluster.device.peak_flops) precisions.push_back(p);
  for (const auto& p : precisions)
    if (!cluster.device.peak_flops.count(p))
      fail("{}: the device has no peak for {} (device.peak_tflops.{})", cluster.source, p, p);
  if (schedules.empty())
    for (const auto& [name, description] : list_schedules()) schedules.push_back(name);

  ScheduleCache cache;
  std::vector<Costed> fits;
  int grids = 0;
  for (int tp : divisors(per_node)) {
    if (!allowed(o.only_tp, tp)) continue;
    if (res.devices % tp || !tp_split_problem(model, tp).empty()) continue;
    for (int pp : divisors(res.devices / tp)) {
      if (pp > model.n_layer || !allowed(o.only_pp, pp)) continue;
      for (int cp : cp_options(cfg, res.devices / tp / pp)) {
        if (!allowed(o.only_cp, cp)) continue;
        const int dp = res.devices / tp / pp / cp;
        if (res.global_batch % dp) continue;
        ++grids;
        Layout grid;
        grid.dp = dp, grid.pp = pp, grid.cp = cp, grid.tp = tp;
        add_grid(cx, o, precisions, schedules, grid, cache, res, fits);
      }
    }
  }
  if (res.candidates == 0 && !o.only_cp.empty())
    fail(
        "no layout of {} on {} devices has cp in [{}] (with the other restrictions given): cp must divide the "
        "devices left by tp x pp, 2 cp divide "
        "train.seq_len ({}) leaving each rank {} tokens or more, and the model have no experts",
        cfg.source, res.devices, fmt::join(o.only_cp, ", "), cfg.train.seq_len, kMinRingChunk);
  if (grids == 0 && (!o.only_tp.empty() || !o.only_pp.empty()))
    fail("no dp x pp x tp grid of {} devices with tp in [{}] and pp in [{}] fits the model and the global batch ({})",
         res.devices, fmt::join(o.only_tp, ", "), fmt::join(o.only_pp, ", "), res.global_batch);
  if (grids == 0)
    fail(
        "no dp x pp x tp grid of {} devices fits: tp must divide devices_per_node ({}), n_head ({}) and the "
        "key/value heads ({}); pp at most n_layer ({}); dp must divide the global batch ({})",
        res.devices, per_node, model.n_head, model.kv_heads(), model.n_layer, res.global_batch);
  if (res.candidates == 0 && !o.only_ep.empty())
    fail("no layout of {} on {} devices has ep in [{}]: ep must divide dp and model.n_experts ({}), on CPU devices",
         cfg.source, res.devices, fmt::join(o.only_ep, ", "), model.n_experts);
  if (fits.empty())
    fail("no layout of {} on {} devices fits in {} per device ({} less the {} reserve): the smallest needs {} ({})",
         cfg.source, res.devices, gib(res.usable_memory), gib(cluster.device.memory_bytes),
         gib(cluster.device.reserve_bytes), gib(res.smallest_memory), describe(res.smallest));
  rank_fits(cx, cache, o, fits, res);
  if (res.ranked.size() > 1) res.reason = reason(res.ranked[0].second, res.ranked[1].second, res.ranked[1].first);
  if (res.ranked.size() > static_cast<size_t>(o.top)) res.ranked.resize(static_cast<size_t>(std::max(o.top, 1)));
  return res;
}

}  // namespace pipetrain
