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

#include "pipetrain/core/error.hpp"
#include "pipetrain/core/grid_rules.hpp"
#include "pipetrain/model/partition.hpp"
#include "pipetrain/model/stage.hpp"
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

constexpr int kRecvLookahead = 4;  // the trainer's lowering (LowerOptions' default)

// A schedule built once per (name, ranks, stages per rank, microbatches) and shared by
// every layout that runs it.
struct Built {
  bool ok = false;
  Schedule schedule;
  std::vector<int> peaks;
  std::unique_ptr<Program> program;        // lowered on first simulation
  std::unique_ptr<Program> vocab_program;  // with vocabulary slices, placed by the first costs simulated
};
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
        b->ok = true;
      } catch (const Error&) {
        b->ok = false;  // the schedule cannot take these parameters
      }
    }
    return *b;
  }
  const Program& program(Built& b, bool vocab_parallel, const Costs& costs) {
    const LowerOptions options{kRecvLookahead, INT_MAX};
    if (vocab_parallel) {
      if (!b.vocab_program)
        b.vocab_program = std::make_unique<Program>(lower_vocab_parallel(b.schedule, options, costs));
      return *b.vocab_program;
    }
    if (!b.program) b.program = std::make_unique<Program>(lower(b.schedule, options));
    return *b.program;
  }

 private:
  std::map<ScheduleKey, std::unique_ptr<Built>> cache_;
};

// One layout costed up to (not including) its simulation.
struct Costed {
  Layout layout;
  Built* built = nullptr;
  Costs costs;                               // per stage
  double transfer = 0;                       // one activation between stages
  std::vector<double> busy, tp_comm;         // per pipeline rank, over the step
  std::vector<double> dp, optimizer, other;  // per pipeline rank, after the program
  RankMemory memory;                         // the rank that holds the most
  std::vector<MemoryInputs> inputs;          // per pipeline rank
  double lower_bound = 0;
};

struct Context {
  const Config& cfg;
  const ClusterSpec& cluster;
  int devices, global_batch;
  double bucket_bytes;
};

// runtime.pack_weights: true and false as set; "auto" packs every rank or none, by the
// rank with the most copies (as the Trainer decides), on CPUs only.
bool planned_packing(const Context& cx, const Layout& l, const Schedule& s, const std::vector<StageUnits>& units) {
  const ModelConfig& model = cx.cfg.model;
  const ClusterSpec& c = cx.cluster;
  const int R = s.num_ranks, tp = l.tp;
  bool pack = cx.cfg.runtime.pack_weights == Toggle::On;
  if (cx.cfg.runtime.pack_weights == Toggle::Auto) {
    std::vector<double> dense_on(static_cast<size_t>(R), 0.0);
    for (int st = 0; st < s.num_stages; ++st)
      for (const StagePiece& p : stage_pieces(model, units[static_cast<size_t>(st)]))
        dense_on[static_cast<size_t>(s.stage_to_rank[static_cast<size_t>(st)])] +=
            dense_weight_params(model, p.kind, tp);
    PackInputs in;
    in.can_pack = c.device.kind == "cpu";
    in.f32_products = !(l.precision == "bf16" && multiplies_bf16(c.device));
    in.d_model = model.d_model;
    in.rows = l.microbatch_size * cx.cfg.train.seq_len;
    in.microbatches = l.microbatches;
    in.copies_bytes = 8.0 * *std::max_element(dense_on.begin(), dense_on.end());
    in.memory_per_rank = c.device.memory_bytes;
    pack = choose_pack_weights(in).on;
  }
  return pack;
}

// What rank r holds of the model: its parameters (as stored, widened for products and
// in dense products' weights), its largest stage stash, and which pieces it has. Under
// vocabulary parallelism the embedding and head pieces keep their positions and final norm;
// every rank holds its slice of the table(s) instead.
struct Holdings {
  double params = 0, widened = 0, dense = 0, largest_stash = 0;
  bool embedding = false, head = false, block = false;
};
Holdings rank_holdings(const ModelConfig& model, const Layout& l, const Schedule& s,
                       const std::vector<StageUnits>& units, int r, int T, const AttentionKeeps& keeps,
                       bool native_bf16) {
  const DType storage = l.precision == "bf16" ? DType::BF16 : DType::F32;
  Holdings h;
  const bool vp = l.vocab_parallel;
  for (int st = 0; st < s.num_stages; ++st) {
    if (s.stage_to_rank[static_cast<size_t>(st)] != r) continue;
    const auto& u = units[static_cast<size_t>(st)];
    h.largest_stash = std::max(h.largest_stash, stash_bytes(model, u.first, u.last, l.tp, l.microbatch_size, T, storage,
                                                            l.recompute, keeps, vp));
    for (const StagePiece& p : stage_pieces(model, u)) {
      const bool table = p.kind == UnitKind::Embedding || p.kind == UnitKind::Head;
      const double params =
          vp && table ? unit_params(model, p.kind).replicated : unit_params(model, p.kind).on_rank(l.tp);
      h.widened += native_bf16 ? widened_params(model, p.kind, l.tp, true) : params;
      h.dense += vp && table ? 0.0 : dense_weight_params(model, p.kind, l.tp);
      h.params += params;
      h.embedding = h.embedding || p.kind == UnitKind::Embedding;
      h.head = h.head || p.kind == UnitKind::Head;
      h.block = h.block || is_block_part(p.kind);
    }
  }
  if (vp) {  // the slice of one table (tied) or of two
    const double slice = (model.tied() ? 1 : 2) * unit_params(model, UnitKind::Head).sharded / (l.pp * l.tp);
    h.params += slice;
    if (!native_bf16) h.widened += slice;
  } else if (h.embedding && h.head && model.tied()) {  // one table serves both
    const double table = unit_params(model, UnitKind::Head).sharded / l.tp;
    h.params -= table;
    if (!native_bf16) h.widened -= table;
  }
  return h;
}

// One microbatch's backward on rank r, summed over its stages (what dp buckets hide behind).
double stage_backward_on(int r, const Schedule& s, const Costs& costs) {
  double b = 0;
  for (int st = 0; st < s.num_stages; ++st)
    if (s.stage_to_rank[static_cast<size_t>(st)] == r) b += costs.per_stage[static_cast<size_t>(st)][1];
  return b;
}

// The dp reduction's time not hidden behind the last microbatch's backward, on a rank
// with `grads` bytes of gradients. Buckets go out while that backward still runs; the
// last one cannot. ZeRO-1 reduces the same buckets to their owners (a reduce-scatter's
// bytes, overlapped alike, except `held` bytes, a tied table that waits for its copies'
// pair sum) and all-gathers the updated weights after AdamW, exposed.
double dp_exposed_seconds(const Context& cx, const Layout& l, double grads, double backward, double held) {
  if (l.dp == 1) return 0.0;
  const LinkSpec& dp_link = group_link(cx.cluster, l.tp, l.dp);
  const double t_gather = allgather_seconds(grads, l.dp, dp_link);  // = a reduce-scatter's
  const double t_red = l.zero1 ? t_gather : allreduce_seconds(grads, l.dp, dp_link);
  const double last_bucket = t_red * std::min(1.0, cx.bucket_bytes / std::max(grads, 1.0));
  const double t_held = t_red * std::min(1.0, held / std::max(grads, 1.0));
  return std::max({last_bucket, t_held, t_red - backward}) + (l.zero1 ? t_gather : 0.0);
}

// Vocabulary parallelism: one rank's slice per microbatch (Costs::vocab, EF OF OB EB). OF
// computes 1/pp of the output layer's logits and input gradient, OB of its weight
// gradient; a lookup into a slice still writes a whole N x C partial. The two reductions
// keep every rank busy and are charged to their slices, whole (the progress thread hides
// some): EF's partial lookups summed, OF's softmax partials (2 N x C). The simulation
// delays each collective's consumer by a transfer, as it does a send.
std::array<double, 4> vocab_costs(const Context& cx, const Layout& l, const ActionTimes& embedding,
                                  const ActionTimes& head) {
  const double N = static_cast<double>(l.microbatch_size) * cx.cfg.train.seq_len, C = cx.cfg.model.d_model;
  const double act = 4.0 * N * C;
  const int ranks = l.pp * l.tp;
  const LinkSpec& link = group_link(cx.cluster, l.dp * l.tp, l.pp);
  const double sum = allreduce_seconds(act, ranks, link), partials = allreduce_seconds(2 * act, ranks, link);
  return {embedding.F + sum, (head.F + head.I) / l.pp + partials, head.W / l.pp, embedding.I + embedding.W};
}

// The stages' split and their costs per microbatch (out.costs; tp communication per stage
// in stage_tp). A stage's pieces (partition.hpp) are priced as the cost model's units. Under
// vocabulary parallelism the slices' work (vocab_costs) is every rank's; the stages split
// the blocks, their ends keeping positions and the final norm (as the Trainer splits).
std::vector<StageUnits> price_stages(const Context& cx, Layout& l, int S, Costed& out, std::vector<double>& stage_tp) {
  const ModelConfig& model = cx.cfg.model;
  std::map<UnitKind, ActionTimes> times;
  for (UnitKind k : {UnitKind::Embedding, UnitKind::Block, UnitKind::Attention, UnitKind::Mlp, UnitKind::Head})
    times[k] =
        unit_times(cx.cluster, model, k, l.tp, l.microbatch_size, cx.cfg.train.seq_len, l.precision, l.recompute);
  auto total = [&](UnitKind k) { return times[k].F + times[k].I + times[k].W; };
  const bool vp = l.vocab_parallel;
  if (vp) {
    out.costs.vocab = vocab_costs(cx, l, times[UnitKind::Embedding], times[UnitKind::Head]);
    times[UnitKind::Head] = ActionTimes{};
  }
  const UnitCosts unit_costs{total(UnitKind::Embedding), total(UnitKind::Block), total(UnitKind::Head),
                             total(UnitKind::Attention) / total(UnitKind::Block)};
  const std::vector<StageUnits> units =
      partition_gpt2(model, S, {}, vp ? unit_costs.vocabulary_parallel() : unit_costs);
  l.blocks_per_stage = blocks_per_stage(model, units);
  out.costs.per_stage.resize(static_cast<size_t>(S));
  stage_tp.assign(static_cast<size_t>(S), 0.0);
  for (int st = 0; st < S; ++st) {
    double F = 0, I = 0, W = 0, comm = 0;
    for (const StagePiece& p : stage_pieces(model, units[static_cast<size_t>(st)])) {
      const ActionTimes& t = times[p.kind];
      F += t.F, I += t.I, W += t.W, comm += t.tp_comm;
    }
    out.costs.per_stage[static_cast<size_t>(st)] = {F, I + W, I, W};
    stage_tp[static_cast<size_t>(st)] = comm;
  }
  return units;
}

// Costs everything but the timeline. `built` is the layout's schedule.
Costed cost_layout(const Context& cx, Layout l, Built& built) {
  const ModelConfig& model = cx.cfg.model;
  const ClusterSpec& c = cx.cluster;
  const int T = cx.cfg.train.seq_len, B = l.microbatch_size, tp = l.tp;
  const Schedule& s = built.schedule;
  const int S = s.num_stages, R = s.num_ranks, m = l.microbatches;
  const bool vp = l.vocab_parallel;
  Costed out;
  std::vector<double> stage_tp;
  const std::vector<StageUnits> units = price_stages(cx, l, S, out, stage_tp);
  const bool bf16 = l.precision == "bf16", native_bf16 = multiplies_bf16(c.device);
  const DType storage = bf16 ? DType::BF16 : DType::F32;
  const double N = static_cast<double>(B) * T, act = N * model.d_model * static_cast<double>(dtype_size(storage));
  const LinkSpec& pp_link = group_link(c, l.dp * tp, l.pp);
  // Each tp rank sends its 1/tp slice; the receiving stage all-gathers it.
  out.transfer = R > 1 ? p2p_seconds(act / tp, pp_link) + allgather_seconds(act, tp, group_link(c, 1, tp)) : 0;
  const AttentionKeeps keeps = attention_keeps(c.device.kind, model.d_model / model.n_head);
  const UnitParams up_head = unit_params(model, UnitKind::Head);
  const Recompute mode = l.recompute;
  const double world_latency =
      allreduce_seconds(8.0, cx.devices, cx.devices <= c.devices_per_node ? c.intra_node : c.inter_node);
  const bool pack = planned_packing(cx, l, s, units);
  out.busy.assign(static_cast<size_t>(R), 0.0);
  out.tp_comm = out.dp = out.optimizer = out.other = out.busy;
  for (int r = 0; r < R; ++r) {
    const Holdings h = rank_holdings(model, l, s, units, r, T, keeps, native_bf16);
    const double params = h.params, widened = h.widened, dense = h.dense, largest = h.largest_stash;
    const bool embedding = h.embedding, block = h.block;
    for (int st = 0; st < S; ++st) {
      if (s.stage_to_rank[static_cast<size_t>(st)] != r) continue;
      const auto& pc = out.costs.per_stage[static_cast<size_t>(st)];
      out.busy[r] += m * (pc[0] + pc[1]);
      out.tp_comm[r] += m * stage_tp[static_cast<size_t>(st)];
    }
    for (double v : out.costs.vocab) out.busy[r] += m * v;
    // A tied table on two ranks is updated on the head's only; the embedding's rank skips it.
    const bool tied_pair = model.tied() && h.embedding != h.head && !vp;
    out.dp[r] = dp_exposed_seconds(cx, l, 4.0 * params, stage_backward_on(r, s, out.costs),
                                   tied_pair && l.zero1 ? 4.0 * up_head.sharded / tp : 0.0);
    const double updated = params - (tied_pair && embedding ? up_head.sharded / tp : 0.0);
    out.optimizer[r] =
        adamw_seconds(updated / (l.zero1 && l.dp > 1 ? l.dp : 1), c.device) + gradient_passes_seconds(params, c.device);
    // The table's summed gradient comes back to the head's rank before its update, and
    // the updated table back to the embedding's rank.
    const double tied = tied_pair ? p2p_seconds(4.0 * up_head.sharded / tp, pp_link) : 0;
    out.other[r] = tied + world_latency;
    MemoryInputs in;
    in.params = params;
    in.not_updated = tied_pair && embedding ? up_head.sharded / tp : 0.0;  // the embedding's copy of the table
    in.dp = l.dp;
    in.zero1 = l.zero1;
    in.bf16 = bf16;
    in.widened = widened;
    in.largest_stash = largest;
    in.peak_inflight = built.peaks[static_cast<size_t>(r)];
    in.recompute = block ? recompute_bytes(model, tp, B, T, storage, mode, keeps) : 0.0;
    in.activation_bytes = R > 1 ? act : 0.0;
    in.receive_buffers = R > 1 ? kRecvLookahead : 0;
    in.dp_bucket_bytes = l.dp > 1 ? cx.bucket_bytes : 0.0;
    in.packed = pack && !(bf16 && native_bf16) ? dense : 0.0;  // f32 products only
    if (vp) add_vocab_memory_bound(h.head, m, model, l.pp * tp, B, T, storage, in);
    out.inputs.push_back(in);
    const RankMemory mem = rank_memory(in);
    if (mem.total() > out.memory.total()) out.memory = mem;
    out.lower_bound = std::max(out.lower_bound, out.busy[r] + out.dp[r] + out.optimizer[r] + out.other[r]);
  }
  out.layout = std::move(l);
  out.built = &built;
  return out;
}

Prediction simulate_layout(const Context& cx, ScheduleCache& cache, Costed& k) {
  const bool vp = k.layout.vocab_parallel;
  const Program& prog = cache.program(*k.built, vp, k.costs);
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
    p.compute_s = k.busy[i] - k.tp_comm[i];
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
                       k.layout.microbatch_size, T, storage, in);
      const RankMemory mem = rank_memory(in);
      if (mem.total() > p.memory.total()) p.memory = mem;
    }
  }
  return p;
}

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
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
  return fmt::format("dp {} x pp {} x tp {}, {}, {} x {} seq, recompute {}, ZeRO-1 {}, {}{}", l.dp, l.pp, l.tp, sched,
                     l.microbatches, l.microbatch_size, to_string(l.recompute), l.zero1 ? "on" : "off", l.precision,
                     l.vocab_parallel ? ", vocabulary parallel" : "");
}

Layout layout_of(const Config& cfg) {
  Layout l;
  l.dp = cfg.parallel.dp, l.pp = cfg.parallel.pp, l.tp = cfg.parallel.tp,
  l.virtual_stages = cfg.parallel.virtual_stages;
  l.schedule = cfg.schedule.name;
  l.microbatches = cfg.train.microbatches;
  l.microbatch_size = cfg.train.global_batch / std::max(1, cfg.parallel.dp * cfg.train.microbatches);
  l.recompute = parse_recompute(cfg.train.recompute);
  l.zero1 = cfg.parallel.zero1 && cfg.parallel.dp > 1;
  l.precision = cfg.train.precision;
  l.vocab_parallel = choose_vocab_parallel(cfg).on;
  return l;
}

std::vector<std::string> with_planning_layout(const std::vector<std::string>& overrides) {
  std::vector<std::string> all = {"parallel.dp=1",
                                  "parallel.pp=1",
                                  "parallel.tp=1",
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
  return {fmt::format("parallel.dp={}", l.dp),
          fmt::format("parallel.pp={}", l.pp),
          fmt::format("parallel.tp={}", l.tp),
          fmt::format("parallel.virtual_stages={}", l.virtual_stages),
          "parallel.layers_per_stage=auto",
          fmt::format("parallel.zero1={}", l.zero1 ? "true" : "false"),
          fmt::format("schedule.name={}", l.schedule),
          fmt::format("train.microbatches={}", l.microbatches),
          fmt::format("train.global_batch={}", l.dp * l.microbatches * l.microbatch_size),
          fmt::format("train.recompute={}", to_string(l.recompute)),
          fmt::format("train.precision={}", l.precision),
          fmt::format("parallel.vocab_parallel={}", l.vocab_parallel ? "true" : "false")};
}

Prediction predict(const Config& cfg, const ClusterSpec& cluster, Layout& layout, int global_batch) {
  const int devices = layout.dp * layout.pp * layout.tp;
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
  Costed k = cost_layout(cx, layout, b);
  layout.blocks_per_stage = k.layout.blocks_per_stage;
  return simulate_layout(cx, cache, k);
}

// parallel.vocab_parallel for a grid: false and true as set (true only where the grid
// can take the slices), both under "auto" where there is a pipeline to balance.
std::vector<bool> vocab_options(const Context& cx, const Layout& l) {
  const Toggle t = cx.cfg.parallel.vocab_parallel;
  if (t == Toggle::Off) return {false};
  Config c = cx.cfg;
  c.parallel.pp = l.pp, c.parallel.tp = l.tp, c.runtime.device = cx.cluster.device.kind;
  const bool can = vocab_parallel_problem(c).empty();
  if (t == Toggle::On) return can ? std::vector<bool>{true} : std::vector<bool>{};
  return can && l.pp > 1 ? std::vector<bool>{false, true} : std::vector<bool>{false};
}

// The layout `l` (its grid, schedule and microbatches set) in each precision, recompute
// mode, ZeRO-1 and vocabulary-parallel setting asked for: costed, kept in `fits` where it
// fits in memory, and the smallest of all remembered for the error that none fits.
void add_variants(const Context& cx, const PlanOptions& o, const std::vector<std::string>& precisions, const Layout& l,
                  Built& b, PlanResult& res, std::vector<Costed>& fits) {
  const std::vector<bool> vocab = vocab_options(cx, l);
  for (const auto& prec : precisions)
    for (const auto& rc : o.recompute)
      for (bool z : o.zero1)
        for (bool vp : vocab) {
          if (z && l.dp == 1) continue;
          Layout v = l;
          v.recompute = parse_recompute(rc), v.zero1 = z, v.precision = prec, v.vocab_parallel = vp;
          ++res.candidates;
          Costed k = cost_layout(cx, std::move(v), b);
          const double need = k.memory.total() + cx.cluster.device.reserve_bytes;
          if (res.smallest_memory == 0 || need < res.smallest_memory)
            res.smallest = k.layout, res.smallest_memory = need;
          if (k.memory.total() > res.usable_memory) {
            ++res.pruned_memory;
            continue;
          }
          fits.push_back(std::move(k));
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
  auto allowed = [](const std::vector<int>& only, int x) {
    return only.empty() || std::find(only.begin(), only.end(), x) != only.end();
  };
  for (int tp : divisors(per_node)) {
    if (!allowed(o.only_tp, tp)) continue;
    if (res.devices % tp || !tp_split_problem(model, tp).empty()) continue;
    for (int pp : divisors(res.devices / tp)) {
      if (pp > model.n_layer || !allowed(o.only_pp, pp)) continue;
      const int dp = res.devices / tp / pp;
      if (res.global_batch % dp) continue;
      ++grids;
      const int per_replica = res.global_batch / dp;
      for (int m : divisors(per_replica)) {
        for (const auto& name : pp == 1 ? std::vector<std::string>{"1f1b"} : schedules) {
          for (int v = 1; v <= (pp == 1 ? 1 : o.max_virtual_stages); v *= 2) {
            if (!stage_split_problem(model, int64_t{pp} * v).empty()) break;
            if (pp > 1 && !allowed(o.only_virtual, v)) continue;
            Built& b = cache.get(name, pp, v, m);
            if (!b.ok) continue;
            Layout l;
            l.dp = dp, l.pp = pp, l.tp = tp, l.virtual_stages = v, l.schedule = name;
            l.microbatches = m, l.microbatch_size = per_replica / m;
            add_variants(cx, o, precisions, std::move(l), b, res, fits);
          }
        }
      }
    }
  }
  if (grids == 0 && (!o.only_tp.empty() || !o.only_pp.empty()))
    fail("no dp x pp x tp grid of {} devices with tp in [{}] and pp in [{}] fits the model and the global batch ({})",
         res.devices, fmt::join(o.only_tp, ", "), fmt::join(o.only_pp, ", "), res.global_batch);
  if (grids == 0)
    fail(
        "no dp x pp x tp grid of {} devices fits: tp must divide devices_per_node ({}), n_head ({}) and the "
        "key/value heads ({}); pp at most n_layer ({}); dp must divide the global batch ({})",
        res.devices, per_node, model.n_head, model.kv_heads(), model.n_layer, res.global_batch);
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
