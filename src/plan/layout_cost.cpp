// cost_layout and its parts (layout_cost.hpp).
#include "layout_cost.hpp"

#include <algorithm>
#include <array>
#include <map>

#include "pipetrain/model/partition.hpp"
#include "pipetrain/model/stage.hpp"
#include "pipetrain/plan/memory_estimate.hpp"
#include "pipetrain/plan/product_choice.hpp"
#include "pipetrain/plan/run_plan.hpp"
#include "pipetrain/plan/vocab_memory.hpp"
#include "pipetrain/schedule/stage_transfer.hpp"

namespace pipetrain {

namespace {

// A rank's tokens of each sequence (a cp-th under context parallelism).
int rank_tokens(const Context& cx, const Layout& l) { return cx.cfg.train.seq_len / l.cp; }

// runtime.pack_weights = "auto" where the cluster file has rates with and without packing:
// plan/product_choice's rule (what the trainer weighs per weight shape at start-up) on one
// block's products per microbatch, saved against its reorders, m uses a step. Nothing
// where the file has no such rates (choose_pack_weights' fixed rule then decides).
std::optional<bool> packing_timed_to_pay(const Context& cx, const Layout& l) {
  const ClusterSpec& c = cx.cluster;
  const auto rates = c.device.measured.find(l.precision);
  if (cx.cfg.runtime.pack_weights != Toggle::Auto || rates == c.device.measured.end() || !rates->second.has_packed())
    return std::nullopt;
  const UnitWork w = unit_work(cx.cfg.model, UnitKind::Block, l.tp, l.microbatch_size, rank_tokens(cx, l));
  const double flops = w.f_flops + w.i_flops + w.w_flops,
               tokens = static_cast<double>(l.microbatch_size) * rank_tokens(cx, l) / l.tp;
  const double plain = flops / rates->second.block_at(tokens, false),
               packed = flops / rates->second.block_at(tokens, true);
  return packing_pays(plain - packed, plain, rates->second.block_reorder_s / l.tp, l.microbatches);
}

// runtime.pack_weights: true and false as set; "auto" packs every rank or none, by the
// rank with the most copies (as the Trainer decides), on CPUs only.
bool planned_packing(const Context& cx, const Layout& l, const Schedule& s, const std::vector<StageUnits>& units,
                     std::optional<bool> timed) {
  const ModelConfig& model = cx.cfg.model;
  const ClusterSpec& c = cx.cluster;
  const int R = s.num_ranks, tp = l.tp;
  bool pack = cx.cfg.runtime.pack_weights == Toggle::On;
  if (cx.cfg.runtime.pack_weights == Toggle::Auto) {
    std::vector<double> dense_on(static_cast<size_t>(R), 0.0);
    for (int st = 0; st < s.num_stages; ++st)
      for (const StagePiece& p : stage_pieces(model, units[static_cast<size_t>(st)]))
        dense_on[static_cast<size_t>(s.stage_to_rank[static_cast<size_t>(st)])] +=
            dense_weight_params(model, p.kind, tp, p.block);
    PackInputs in;
    in.can_pack = c.device.kind == "cpu";
    in.f32_products = !(l.precision == "bf16" && multiplies_bf16(c.device));
    in.d_model = model.d_model;
    in.rows = l.microbatch_size * rank_tokens(cx, l);
    in.microbatches = l.microbatches;
    in.copies_bytes = 8.0 * *std::max_element(dense_on.begin(), dense_on.end());
    in.memory_per_rank = c.device.memory_bytes;
    in.measured_pays = timed;
    pack = choose_pack_weights(in).on;
  }
  return pack;
}

// One microbatch's backward on rank r, summed over its stages (what dp buckets hide behind).
double stage_backward_on(int r, const Schedule& s, const Costs& costs) {
  double b = 0;
  for (int st = 0; st < s.num_stages; ++st)
    if (s.stage_to_rank[static_cast<size_t>(st)] == r) b += costs.per_stage[static_cast<size_t>(st)][1];
  return b;
}

// The dp reduction's time not hidden behind the last microbatch's backward, on a rank
// with `grads` bytes of gradients (summed over the dp x cp ranks holding the same parameters). Buckets go out while
// that backward still runs; the last one cannot. ZeRO-1 reduces the same buckets to their owners (a reduce-scatter's
// bytes, overlapped alike, except `held` bytes, a tied table that waits for its copies'
// pair sum) and all-gathers the updated weights after AdamW, exposed.
double dp_exposed_seconds(const Context& cx, const Layout& l, double grads, double backward, double held) {
  const int ranks = l.dp * l.cp;
  if (ranks == 1) return 0.0;
  const LinkSpec& dp_link = group_link(cx.cluster, l.tp, ranks);
  const double t_gather = allgather_seconds(grads, ranks, dp_link);  // = a reduce-scatter's
  const double t_red = l.zero1 ? t_gather : allreduce_seconds(grads, ranks, dp_link);
  const double last_bucket = t_red * std::min(1.0, cx.bucket_bytes / std::max(grads, 1.0));
  const double t_held = t_red * std::min(1.0, held / std::max(grads, 1.0));
  // (Under "weights" the updated parts stay where they are: no gather after the update.)
  const bool gathers_values = l.zero1 && l.shard != ShardLevel::Weights;
  return std::max({last_bucket, t_held, t_red - backward}) + (gathers_values ? t_gather : 0.0);
}

// parallel.shard = "weights": each unit's weights all-gathered once per window — once a step
// under "keep", else for each microbatch's forward and backward. Posted ahead of their work
// (prefetch ≥ 1): exposed where the gathers outlast the rank's compute, and the first unit's
// always; posted at their work (prefetch 0): every one waited for. `dense` bytes gather over
// a shard group, `experts` over its ranks holding the same experts (none where one does).
double gather_exposed_seconds(const Context& cx, const Layout& l, double dense, double experts, double busy,
                              double largest) {
  const ShardSpans spans = shard_spans(l, l.shard_group);
  const LinkSpec& link = group_link(cx.cluster, l.tp, spans.dense);
  const double windows = l.shard_keep ? 1.0 : 2.0 * l.microbatches;
  const double total =
      windows * (allgather_seconds(dense, spans.dense, link) +
                 allgather_seconds(experts, spans.experts, group_link(cx.cluster, l.tp, spans.experts)));
  if (l.shard_prefetch == 0) return total;
  return allgather_seconds(largest, spans.dense, link) + std::max(0.0, total - busy);
}

// Vocabulary parallelism: one rank's slice per microbatch (Costs::vocab, EF OF OB EB). OF
// computes 1/pp of the output layer's logits and input gradient, OB of its weight
// gradient; a lookup into a slice still writes a whole N x C partial. The two reductions
// keep every rank busy and are charged to their slices, whole (the progress thread hides
// some): EF's partial lookups summed, OF's softmax partials (2 N x C). The simulation
// delays each collective's consumer by a transfer, as it does a send.
std::array<double, 4> vocab_costs(const Context& cx, const Layout& l, const ActionTimes& embedding,
                                  const ActionTimes& head) {
  const double N = static_cast<double>(l.microbatch_size) * rank_tokens(cx, l), C = cx.cfg.model.d_model;
  const double act = 4.0 * N * C;
  const int ranks = l.pp * l.tp;
  const LinkSpec& link = group_link(cx.cluster, l.dp * l.cp * l.tp, l.pp);
  const double sum = allreduce_seconds(act, ranks, link), partials = allreduce_seconds(2 * act, ranks, link);
  return {embedding.F + sum, (head.F + head.I) / l.pp + partials, head.W / l.pp, embedding.I + embedding.W};
}

// The share of rank r's forwards and backwards that run in an F&B pair (schedule.overlap):
// each hides its expert exchanges behind its partner's compute.
double paired_share(const Context& cx, const Schedule& s, int r) {
  // On GPUs the pipeline goes over NCCL (comm.p2p's default, one rank per GPU): pairs run in order.
  if (!cx.cfg.schedule.overlap || cx.cluster.device.kind != "cpu") return 0.0;
  if (s.pairs.empty() || s.pairs[static_cast<size_t>(r)].empty()) return 0.0;
  int computes = 0;
  for (const Action& a : s.per_rank[static_cast<size_t>(r)]) computes += a.op == Op::F || a.op == Op::B;
  return computes ? 2.0 * static_cast<double>(s.pairs[static_cast<size_t>(r)].size()) / computes : 0.0;
}

// The expert exchange a mixture-of-experts piece adds to its F and to its I, less what an
// F&B pair hides (`paired` of them, each behind up to the partner's compute).
double exposed_exchange(double exchange, double paired, const ActionTimes& t) {
  return exchange - paired * std::min(exchange, std::min(t.F, t.I));
}

// The stages' split and their costs per microbatch (out.costs; tp communication per stage
// in stage_tp, the expert all-to-alls' exposed time in stage_ep, the ring's in stage_cp). A stage's pieces
// (partition.hpp) are priced as the cost model's units, a mixture of experts' as its own.
// Under vocabulary parallelism the slices' work (vocab_costs) is every rank's; the stages
// split the blocks, their ends keeping positions and the final norm (as the Trainer splits).
std::vector<StageUnits> price_stages(const Context& cx, Layout& l, const Schedule& sched, Costed& out,
                                     std::vector<double>& stage_tp, std::vector<double>& stage_ep,
                                     std::vector<double>& stage_cp, bool packed) {
  const ModelConfig& model = cx.cfg.model;
  const int S = sched.num_stages, T = rank_tokens(cx, l), context = cx.cfg.train.seq_len;
  std::map<UnitKind, ActionTimes> times, moe_times;
  int first_moe = -1;  // a mixture's block (any: they cost alike)
  for (int b = 0; b < model.n_layer && first_moe < 0; ++b)
    if (model.moe(b)) first_moe = b;
  for (UnitKind k : {UnitKind::Embedding, UnitKind::Block, UnitKind::Attention, UnitKind::Mlp, UnitKind::Head}) {
    times[k] =
        unit_times(cx.cluster, model, k, l.tp, l.microbatch_size, T, l.precision, l.recompute, -1, context, packed);
    moe_times[k] =
        unit_times(cx.cluster, model, k, l.tp, l.microbatch_size, T, l.precision, l.recompute, first_moe, 0, packed);
  }
  const ActionTimes ring = ring_seconds(cx.cluster, model, l.tp, l.cp, l.microbatch_size, context, l.precision);
  const double exchange = expert_exchange_seconds(cx.cluster, model, l.tp, l.ep, l.microbatch_size, T);
  // Blocks split by a mixture's cost where the model has one (most of its blocks are).
  if (first_moe >= 0) times[UnitKind::Block] = moe_times[UnitKind::Block];
  auto total = [&](UnitKind k) { return times[k].F + times[k].I + times[k].W; };
  const bool vp = l.vocab_parallel;
  if (vp) {
    out.costs.vocab = vocab_costs(cx, l, times[UnitKind::Embedding], times[UnitKind::Head]);
    times[UnitKind::Head] = ActionTimes{};
  }
  const UnitCosts unit_costs{total(UnitKind::Embedding), total(UnitKind::Block), total(UnitKind::Head),
                             total(UnitKind::Attention) / total(UnitKind::Block)};
  // The config's own split where it gives one for these stages (check and train's
  // header price the run's layout), else the balanced one.
  auto& split = cx.splits[{S, vp, unit_costs.embedding, unit_costs.block, unit_costs.head, unit_costs.attention_share}];
  if (split.empty()) split = stage_split(model, S, cx.cfg.parallel.layers_per_stage, vp, unit_costs);
  const std::vector<StageUnits>& units = split;
  l.blocks_per_stage = blocks_per_stage(model, units);
  out.costs.per_stage.resize(static_cast<size_t>(S));
  stage_tp.assign(static_cast<size_t>(S), 0.0);
  stage_ep.assign(static_cast<size_t>(S), 0.0);
  stage_cp.assign(static_cast<size_t>(S), 0.0);
  for (int st = 0; st < S; ++st) {
    const double paired = paired_share(cx, sched, sched.stage_to_rank[static_cast<size_t>(st)]);
    double F = 0, I = 0, W = 0, comm = 0, ep = 0, cp = 0;
    for (const StagePiece& p : stage_pieces(model, units[static_cast<size_t>(st)])) {
      const bool experts = p.kind != UnitKind::Attention && p.block >= 0 && model.moe(p.block);
      const bool attends = p.kind == UnitKind::Block || p.kind == UnitKind::Attention;
      const ActionTimes& t = experts ? moe_times[p.kind] : times[p.kind];
      const double x = experts ? exposed_exchange(exchange, paired, t) : 0.0;
      ActionTimes r = attends ? ring : ActionTimes{};
      if (l.recompute != Recompute::None) r.I += r.F;  // the forward's ring again, before the backward
      F += t.F + x + r.F, I += t.I + x + r.I, W += t.W, comm += t.tp_comm, ep += 2 * x, cp += r.F + r.I;
    }
    out.costs.per_stage[static_cast<size_t>(st)] = {F, I + W, I, W};
    stage_tp[static_cast<size_t>(st)] = comm;
    stage_ep[static_cast<size_t>(st)] = ep;
    stage_cp[static_cast<size_t>(st)] = cp;
  }
  return units;
}

// The stages priced as the run will multiply: packed where "auto" would pack (its memory
// test needs the split: priced again in the rare case it undoes the packing). Whether the
// run packs.
bool price_as_run(const Context& cx, Layout& l, const Schedule& s, Costed& out, std::vector<double>& stage_tp,
                  std::vector<double>& stage_ep, std::vector<double>& stage_cp, std::vector<StageUnits>& units) {
  const std::optional<bool> timed = packing_timed_to_pay(cx, l);
  const bool priced_packed = cx.cfg.runtime.pack_weights == Toggle::On || timed.value_or(false);
  units = price_stages(cx, l, s, out, stage_tp, stage_ep, stage_cp, priced_packed);
  const bool pack = planned_packing(cx, l, s, units, timed);
  if (pack != priced_packed) units = price_stages(cx, l, s, out, stage_tp, stage_ep, stage_cp, pack);
  return pack;
}

}  // namespace

// Costs everything but the timeline. `built` is the layout's schedule.
Costed cost_layout(const Context& cx, Layout l, Built& built) {
  const ModelConfig& model = cx.cfg.model;
  const ClusterSpec& c = cx.cluster;
  const int T = rank_tokens(cx, l), B = l.microbatch_size, tp = l.tp;
  const Schedule& s = built.schedule;
  const int S = s.num_stages, R = s.num_ranks, m = l.microbatches;
  const bool vp = l.vocab_parallel;
  Costed out;
  std::vector<double> stage_tp, stage_ep, stage_cp;
  std::vector<StageUnits> units;
  const bool pack = price_as_run(cx, l, s, out, stage_tp, stage_ep, stage_cp, units);
  const bool bf16 = l.precision == "bf16", native_bf16 = multiplies_bf16(c.device);
  const DType storage = bf16 ? DType::BF16 : DType::F32;
  const double N = static_cast<double>(B) * T, act = N * model.d_model * static_cast<double>(dtype_size(storage));
  const LinkSpec& pp_link = group_link(c, l.dp * l.cp * tp, l.pp);
  // Each tp rank sends its 1/tp share (schedule/stage_transfer.hpp): a slice the receiving
  // stage all-gathers, or under sequence parallelism the rows the next stage takes as they are.
  const StageTransfer how = stage_transfer(tp, l.sequence_parallel);
  out.transfer =
      R > 1 ? p2p_seconds(act / tp, pp_link) +
                  (how == StageTransfer::SliceThenGather ? allgather_seconds(act, tp, group_link(c, 1, tp)) : 0.0)
            : 0;
  Placement placement;  // the memory estimate's facts (memory_estimate.hpp), as the run will place it
  placement.schedule = &s;
  placement.units = &units;
  placement.peaks = built.peaks;
  placement.stash_points = &built.stash_points;
  placement.packed = pack;
  placement.native_bf16 = native_bf16;
  placement.device_kind = c.device.kind;
  const UnitParams up_head = unit_params(model, UnitKind::Head);
  const double world_latency =
      allreduce_seconds(8.0, cx.devices, cx.devices <= c.devices_per_node ? c.intra_node : c.inter_node);
  out.busy.assign(static_cast<size_t>(R), 0.0);
  out.tp_comm = out.ep_comm = out.cp_comm = out.dp = out.optimizer = out.other = out.busy;
  for (int r = 0; r < R; ++r) {
    const Holdings h = rank_holdings(model, l, placement, r, T);
    const double params = h.params, experts = l.ep > 1 ? h.experts : 0.0;
    for (int st = 0; st < S; ++st) {
      if (s.stage_to_rank[static_cast<size_t>(st)] != r) continue;
      const auto& pc = out.costs.per_stage[static_cast<size_t>(st)];
      out.busy[r] += m * (pc[0] + pc[1]);
      out.tp_comm[r] += m * stage_tp[static_cast<size_t>(st)];
      out.ep_comm[r] += m * stage_ep[static_cast<size_t>(st)];
      out.cp_comm[r] += m * stage_cp[static_cast<size_t>(st)];
    }
    for (double v : out.costs.vocab) out.busy[r] += m * v;
    // A step's reorders of the packed copies (once per step, after the update).
    if (const auto rates = c.device.measured.find(l.precision); pack && rates != c.device.measured.end())
      out.busy[r] += (h.blocks * rates->second.block_reorder_s +
                      (vp ? rates->second.head_reorder_s / l.pp : h.head ? rates->second.head_reorder_s : 0.0)) /
                     tp;
    // A tied table on two ranks is updated on the head's only; the embedding's rank skips it.
    const bool tied_pair = model.tied() && h.embedding != h.head && !vp;
    out.dp[r] = dp_exposed_seconds(cx, l, 4.0 * params, stage_backward_on(r, s, out.costs),
                                   tied_pair && l.zero1 ? 4.0 * up_head.sharded / tp : 0.0);
    if (l.shard == ShardLevel::Weights && l.dp * l.cp > 1) {  // bf16: the gathers carry the rounded parts
      const double bytes = l.precision == "bf16" ? 2.0 : 4.0;
      out.dp[r] += gather_exposed_seconds(cx, l, bytes * (params - experts), bytes * experts, out.busy[r],
                                          bytes * h.largest_piece);
    }
    const double updated = params - (tied_pair && h.embedding ? up_head.sharded / tp : 0.0);
    out.optimizer[r] =
        adamw_seconds(l.zero1 && l.dp * l.cp > 1 ? zero1_share(updated, experts, l.dp * l.cp, l.ep) : updated,
                      c.device) +
        gradient_passes_seconds(params, c.device);
    // The table's summed gradient comes back to the head's rank before its update, and
    // the updated table back to the embedding's rank.
    const double tied = tied_pair ? p2p_seconds(4.0 * up_head.sharded / tp, pp_link) : 0;
    out.other[r] = tied + world_latency;
    MemoryInputs in = memory_inputs(cx.cfg, l, placement, h, r);
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

}  // namespace pipetrain
