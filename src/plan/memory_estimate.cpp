#include "pipetrain/plan/memory_estimate.hpp"

#include <algorithm>
#include <set>

#include "pipetrain/core/dtype.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/plan/vocab_memory.hpp"
#include "pipetrain/schedule/pair_rule.hpp"
#include "pipetrain/schedule/simulate.hpp"
#include "pipetrain/schedule/stage_transfer.hpp"

namespace pipetrain {

namespace {
DType storage_of(const Layout& l) { return l.precision == "bf16" ? DType::BF16 : DType::F32; }

// What attention keeps for its backward: the ring's log-sum-exp and output under context
// parallelism, else the device's kernels' choice.
AttentionKeeps keeps_of(const ModelConfig& model, const Layout& l, const Placement& p) {
  return l.cp > 1 ? AttentionKeeps::kLogSumExp : attention_keeps(p.device_kind, model.d_model / model.n_head);
}

// Overlapped F&B pairs that defer their B's weight gradients (schedule/pair_rule.hpp) hold
// one more microbatch's stash. Expert exchanges are ordered on GPUs (NCCL), free on CPUs.
bool carries_a_stash(const Config& cfg, const Layout& l, const Placement& p, int r) {
  const Schedule& s = *p.schedule;
  return pair_rule(l.tp, l.ep, l.vocab_parallel, cfg.schedule.overlap, p.device_kind != "cpu").defer_weights &&
         !s.pairs.empty() && !s.pairs[static_cast<size_t>(r)].empty();
}

// The most rank r's stashes hold at once (its largest stage's sizes): each live cell keeps
// its forward stash, each pending one also the weight pass's gradients and what
// recomputation rebuilt. A backward holds one layer's gradients in the making on top
// (bounded by its weight pass's), a B also the one block it rebuilds (`recompute`; it frees
// each layer after its weight pass), and any work its f32 working copies (`working`).
double stash_peak(const std::vector<StashPoint>& points, const Holdings& h, double recompute) {
  double peak = 0;
  for (const StashPoint& x : points) {
    const double during = h.working + (x.during == Op::B   ? h.largest_weight_pass + recompute
                                       : x.during == Op::I ? h.largest_weight_pass
                                                           : 0.0);
    peak = std::max(peak, x.live * h.largest_stash + x.pending * h.weight_pass + during);
  }
  return peak;
}
}  // namespace

std::vector<std::vector<StashPoint>> stash_points(const Schedule& s) {
  std::vector<std::vector<StashPoint>> out;
  for (const auto& actions : s.per_rank) {
    std::set<StashPoint> seen;
    StashPoint now;
    for (const Action& a : actions) {
      now.live += a.op == Op::F;
      now.pending += a.op == Op::I;
      now.during = a.op == Op::B || a.op == Op::I ? a.op : Op::F;
      seen.insert(now);
      now.live -= a.op == Op::B || a.op == Op::W;
      now.pending -= a.op == Op::W;
    }
    std::vector<StashPoint> kept;
    for (const StashPoint& x : seen)
      if (std::none_of(seen.begin(), seen.end(), [&](const StashPoint& y) {
            return y != x && y.during == x.during && y.live >= x.live && y.pending >= x.pending;
          }))
        kept.push_back(x);
    out.push_back(std::move(kept));
  }
  return out;
}

Recompute Placement::recompute_of(const Layout& l, int stage) const {
  return stage_recompute.empty() ? l.recompute : stage_recompute[static_cast<size_t>(stage)];
}

Holdings rank_holdings(const ModelConfig& model, const Layout& l, const Placement& p, int r, int T) {
  const Schedule& s = *p.schedule;
  const DType storage = storage_of(l);
  const AttentionKeeps keeps = keeps_of(model, l, p);
  Holdings h;
  const bool vp = l.vocab_parallel;
  std::vector<StagePiece> pieces;
  for (int st = 0; st < s.num_stages; ++st) {
    if (s.stage_to_rank[static_cast<size_t>(st)] != r) continue;
    const auto& u = (*p.units)[static_cast<size_t>(st)];
    const StashBytes stash = stage_stash(model, u.first, u.last, l.tp, l.microbatch_size, T, storage,
                                         p.recompute_of(l, st), keeps, vp, l.sequence_parallel);
    h.largest_stash = std::max(h.largest_stash, stash.kept);
    h.weight_pass = std::max(h.weight_pass, stash.weight_pass);
    h.largest_weight_pass = std::max(h.largest_weight_pass, stash.largest_weight_pass);
    h.working = std::max(h.working, stash.working);
    for (const StagePiece& piece : stage_pieces(model, u)) {
      const bool table = piece.kind == UnitKind::Embedding || piece.kind == UnitKind::Head;
      const double params = vp && table ? unit_params(model, piece.kind).replicated
                                        : unit_params(model, piece.kind, piece.block).on_rank(l.tp, l.ep);
      h.widened += p.native_bf16 ? widened_params(model, piece.kind, l.tp, true, piece.block) : params;
      pieces.push_back(piece);
      h.params += params;
      h.largest_piece = std::max(h.largest_piece, params);
      if (!table) h.experts += unit_params(model, piece.kind, piece.block).experts / (l.ep * l.tp);
      h.embedding = h.embedding || piece.kind == UnitKind::Embedding;
      h.head = h.head || piece.kind == UnitKind::Head;
      h.block = h.block || is_block_part(piece.kind);
      h.blocks += piece.kind == UnitKind::Block ? 1.0 : is_block_part(piece.kind) ? 0.5 : 0.0;
    }
  }
  h.dense = rank_dense_weight_params(model, pieces, l.tp, vp ? l.pp * l.tp : 0);
  if (vp) {  // the slice of one table (tied) or of two
    const double slice = (model.tied() ? 1 : 2) * unit_params(model, UnitKind::Head).sharded / (l.pp * l.tp);
    h.params += slice;
    if (!p.native_bf16) h.widened += slice;
  } else if (h.embedding && h.head && model.tied()) {  // one table serves both
    const double table = unit_params(model, UnitKind::Head).sharded / l.tp;
    h.params -= table;
    if (!p.native_bf16) h.widened -= table;
  }
  return h;
}

Holdings rank_holdings(const Config& cfg, const Layout& l, const Placement& p, int r) {
  return rank_holdings(cfg.model, l, p, r, cfg.train.seq_len / l.cp);
}

MemoryInputs memory_inputs(const Config& cfg, const Layout& l, const Placement& p, const Holdings& h, int r) {
  const ModelConfig& model = cfg.model;
  const Schedule& s = *p.schedule;
  const int tp = l.tp, B = l.microbatch_size, T = cfg.train.seq_len / l.cp;
  const bool bf16 = l.precision == "bf16", pipeline = s.num_ranks > 1;
  const DType storage = storage_of(l);
  // A tied table on two ranks is updated on the head's only; the embedding's copy has no moments.
  const bool tied_pair = model.tied() && h.embedding != h.head && !l.vocab_parallel;
  MemoryInputs in;
  in.params = h.params;
  in.not_updated = tied_pair && h.embedding ? unit_params(model, UnitKind::Head).sharded / tp : 0.0;
  in.experts = l.ep > 1 ? h.experts : 0.0;
  in.dp = l.replicas();  // the ranks holding the same parameters (ZeRO-1 shares their moments)
  in.ep = l.ep;
  in.zero1 = l.zero1;
  in.shard = l.shard;
  in.spans = shard_spans(l, l.shard_group);
  if (l.shard >= ShardLevel::Gradients) {
    // Before a program is placed, a bound on what it holds whole (placed_memory's program
    // gives the figure): a gradient is open from a unit's first backward of the step to its
    // reduce-scatter after the last, so with more than one microbatch every unit's at once;
    // "regather" holds the layer at work and those prefetched, "keep" every unit.
    const bool one_pass = l.microbatches == 1 && s.num_stages == 1;
    const double moved = ShardSpans::gathered(h.params - in.experts, in.spans.dense) +
                         ShardSpans::gathered(in.experts, in.spans.experts);
    in.in_flight = kScattersInFlight * h.largest_piece;
    in.whole_gradients = (one_pass ? 2.0 * h.largest_piece : moved) + in.in_flight;
    if (l.shard == ShardLevel::Weights)
      in.whole_weights = l.shard_keep ? moved : std::min(moved, (l.shard_prefetch + 2.0) * h.largest_piece);
  }
  in.bf16 = bf16;
  in.widened = h.widened;
  in.largest_stash = h.largest_stash;
  const AttentionKeeps keeps = keeps_of(model, l, p);
  for (int st = 0; st < s.num_stages; ++st) {  // the one block recomputation rebuilds at a time
    if (s.stage_to_rank[static_cast<size_t>(st)] != r) continue;
    const auto pieces = stage_pieces(model, (*p.units)[static_cast<size_t>(st)]);
    if (std::any_of(pieces.begin(), pieces.end(), [](const StagePiece& x) { return is_block_part(x.kind); }))
      in.recompute = std::max(
          in.recompute, recompute_bytes(model, tp, B, T, storage, p.recompute_of(l, st), keeps, l.sequence_parallel));
  }
  const bool carried = carries_a_stash(cfg, l, p, r);  // with its weight pass deferred
  in.peak_inflight = p.peaks[static_cast<size_t>(r)] + (carried ? 1 : 0);
  if (!p.stash_points) fail("memory_inputs: no stash points for the schedule {}", s.name);
  in.stash_peak = stash_peak((*p.stash_points)[static_cast<size_t>(r)], h, in.recompute) +
                  (carried ? h.largest_stash + h.weight_pass : 0.0);
  const double act = static_cast<double>(B) * T * model.d_model * static_cast<double>(dtype_size(storage));
  const bool rows = stage_transfer(tp, l.sequence_parallel) == StageTransfer::Rows;  // a 1/tp share received
  in.activation_bytes = pipeline ? (rows ? act / tp : act) : 0.0;
  in.receive_buffers = pipeline ? p.recv_lookahead : 0;
  in.expert_dp = l.expert_dp();
  in.reduction_scratch = p.device_kind == "cpu";                     // MPI's collectives; on GPUs NCCL's
  in.packed = p.packed && !(bf16 && p.native_bf16) ? h.dense : 0.0;  // f32 products only
  return in;
}

RankMemory placed_memory(const Config& cfg, const Layout& l, const Placement& placement, const Program* program) {
  Placement p = placement;
  std::vector<std::vector<StashPoint>> points;  // once for every rank, where not given
  if (!p.stash_points) p.stash_points = &(points = stash_points(*p.schedule));
  const int T = cfg.train.seq_len / l.cp;
  const DType storage = storage_of(l);
  std::vector<int> vocab_peaks;  // the placed program's own stashes (backwards may be delayed)
  if (l.vocab_parallel && program) vocab_peaks = simulate_program(*program, Costs{}).peak_inflight;
  RankMemory largest;
  for (int r = 0; r < p.schedule->num_ranks; ++r) {
    const Holdings h = rank_holdings(cfg, l, p, r);
    MemoryInputs in = memory_inputs(cfg, l, p, h, r);
    if (l.vocab_parallel && program)
      add_vocab_memory(*program, r, vocab_peaks[static_cast<size_t>(r)], cfg.model, l.vocab_slices(), l.microbatch_size,
                       T, storage, in);
    else if (l.vocab_parallel)
      add_vocab_memory_bound(h.head, l.microbatches, cfg.model, l.vocab_slices(), l.microbatch_size, T, storage, in);
    if (program && !program->shard_peak.empty()) {  // the units the program holds whole at most
      in.whole_weights = static_cast<double>(program->shard_peak[static_cast<size_t>(r)].weights);
      in.whole_gradients = static_cast<double>(program->shard_peak[static_cast<size_t>(r)].gradients);
      in.in_flight = static_cast<double>(program->shard_peak[static_cast<size_t>(r)].in_flight);
      in.whole_together = static_cast<double>(program->shard_peak[static_cast<size_t>(r)].together);
    }
    const RankMemory mem = rank_memory(in);
    if (mem.total() > largest.total()) largest = mem;
  }
  return largest;
}

}  // namespace pipetrain
