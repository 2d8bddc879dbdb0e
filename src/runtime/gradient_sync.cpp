#include "pipetrain/runtime/gradient_sync.hpp"

#include <algorithm>

#include "pipetrain/core/fault.hpp"
#include "pipetrain/model/vocab_slice.hpp"

namespace pipetrain {

GradientSync::GradientSync(const Parts& parts, const std::map<int, ModelStage*>& mine, ShardLevel level,
                           RankUnits units)
    : parts_(parts) {
  ParameterStore& params = parts.params;
  DeviceComms& comms = parts.comms;
  Grid& grid = parts.grid;
  const Config& cfg = parts.cfg;
  Communicator* pair = comms.tied();  // the tied copies' pair, when on two ranks
  if (level >= ShardLevel::Gradients) {
    Communicator* group = &comms.dp();
    Communicator* experts = grid.shape().ep > 1 ? comms.expert_dp() : nullptr;
    const int g = cfg.parallel.shard_group, replicas = grid.comm("dp-cp").size(), ep = grid.shape().ep;
    if (g > 0 && g < replicas) {  // hybrid: shard over consecutive replicas, all-reduce across the groups
      MPI_Comm mine_group = MPI_COMM_NULL, across = MPI_COMM_NULL;
      const MPI_Comm dp = grid.comm("dp-cp").comm();
      const int r = grid.comm("dp-cp").rank();
      MPI_Comm_split(dp, r / g, r, &mine_group);
      MPI_Comm_split(dp, r % g, r, &across);  // (a part's experts too: g takes whole runs of ep ranks)
      shard_group_ = std::make_unique<MpiCommunicator>(mine_group, "dp-shard");
      across_ = std::make_unique<MpiCommunicator>(across, "dp-replicate");
      group = shard_group_.get();
      if (experts) {  // the group's ranks holding the same experts (cp = 1 beside ep)
        MPI_Comm mine_experts = MPI_COMM_NULL;
        MPI_Comm_split(dp, (r / g) * ep + r % ep, r, &mine_experts);
        expert_group_ = std::make_unique<MpiCommunicator>(mine_experts, "edp-shard");
        experts = expert_group_.get();
      }
    }
    units_ = std::make_unique<UnitShards>(params, std::move(units), UnitShards::Groups{*group, experts, across_.get()},
                                          level == ShardLevel::Weights, parts.pool, parts.backend,
                                          cfg.train.precision == "bf16");
    pair_ = pair;
    for (const auto& [s, stage] : mine) holds_head_ = holds_head_ || stage->has_head();
    return;
  }
  const bool zero1 = level == ShardLevel::Optimizer;
  if (zero1)  // this rank's ranges of the flat buffer: their gradients (reduced in place) and moments
    shards_ = std::make_unique<OptimizerShards>(params, grid.shape(), grid.comm("dp-cp").rank(), grid.coords().edp,
                                                parts.pool, parts.backend);
  // Tokens of a replica's step on this rank (a cp-th of each sequence).
  const int64_t row_tokens =
      static_cast<int64_t>(cfg.train.global_batch / grid.shape().dp) * (cfg.train.seq_len / grid.shape().cp);
  if (grid.comm("dp-cp").size() > 1) {
    DataParallelReducer::Options o;
    o.tokens_per_step = row_tokens;
    o.bucket_bytes = static_cast<size_t>(cfg.parallel.dp_bucket_mb * 1048576.0);
    o.progress = parts.progress();
    if (parts.vocab_slice) o.at_end = parts.vocab_slice->parameters();
    o.expert_dp = comms.expert_dp();
    if (zero1) {
      o.shard_elems = shards_->shard_elems();
      o.expert_shard_elems = shards_->expert_shard_elems();
      if (pair) o.late = params.find("wte");  // after its copies' pair sum
    }
    reducer_ = std::make_unique<DataParallelReducer>(params, mine, comms.dp(), parts.backend, parts.pool, o);
  }
  // The last stage sends its copy early unless dp buckets all-reduce wte.grad in place
  // meanwhile (ZeRO-1 holds wte back until the pair sum is in); only then may the first
  // stage keep its embedding's rows too. Built after the reducer, which has the first
  // claim on them.
  if (pair) {
    const bool wte_alone = !reducer_ || zero1;
    tied_ = std::make_unique<TiedGradientExchange>(*params.find("wte"), *pair, mine, parts.backend, parts.pool,
                                                   !comms.tied_in_order() && wte_alone, wte_alone ? row_tokens : 0);
  }
}

double GradientSync::reduction_scratch_peak_bytes() const {
  double bytes = 0;
  for (const auto* c : {&shard_group_, &expert_group_, &across_})
    if (*c) bytes += (*c)->reduction_scratch_peak_bytes();
  return bytes;
}

void GradientSync::initialize(uint64_t seed) {
  if (!units_ || !units_->shards_weights()) return parts_.params.initialize(seed, parts_.backend);
  units_->initialize(seed);
  for (Parameter& p : parts_.params.params())  // the state in no unit, whole on every rank
    if (p.unit < 0) ParameterStore::initialize(p, seed, parts_.backend);
}

void GradientSync::shard_hooks(ExecutorHooks& hooks) {
  if (!units_) return;
  hooks.shard = [this](const Instr& in) { units_->run(in); };
  hooks.layer_units = [this](int stage, int layer, bool reads, bool writes) {
    units_->layer_work(stage, layer, reads, writes);
  };
  hooks.poll = [this] { units_->poll(); };
}

void GradientSync::begin_step(ExecutorHooks& hooks) {
  if (units_) {  // gradients open zeroed, unit by unit
    units_->begin_step();
    return shard_hooks(hooks);
  }
  if (tied_) tied_->settle();  // the previous step's sum is out before wte.grad is zeroed
  parts_.params.zero_grads(parts_.backend);
  if (tied_) tied_->begin_step();
  if (reducer_) {
    reducer_->begin_step();
    hooks.poll = [this] { reducer_->poll(); };
  }
  if (reducer_ || tied_)
    hooks.layer_grads_final = [this](int stage, int layer) {
      if (reducer_) reducer_->layer_final(stage, layer);
      if (tied_) tied_->layer_final(stage, layer);
    };
}

// Each replica's loss is already scaled by 1/global tokens, so summing gradients over
// the dp replicas (and the two tied-embedding copies) gives the mean gradient.
void GradientSync::reduce() {
  if (units_) {
    units_->finish();
    if (pair_)  // the tied table's two copies' parts: laid out alike, so one sum
      if (const Tensor g = units_->grad_part(*parts_.params.find("wte")); g.defined())
        pair_->allreduce_sum(g, parts_.backend.stream())->wait();
    return;
  }
  if (shards_) {  // ZeRO-1: the pair sum first, then the held-back wte goes to its owners
    if (tied_) {
      tied_->finish();
      tied_->settle();  // wte.grad is reduced in place next: the sum's transfer must be done with it
    }
    reducer_->finish();
    return;
  }
  if (reducer_) reducer_->finish();
  if (tied_) tied_->finish();  // the last stage receives the sum later, for its update
}

void GradientSync::gather(const Tensor& src, const Tensor& dst) {
  shards_->gather(parts_.params, src, dst, parts_.comms.dp(), parts_.comms.expert_dp(), parts_.backend);
}

// One reduction over the flat gradient buffer (its padding is zero), less the parameters
// that do not count (the last stage's tied-embedding copy): one launch, not one per tensor.
bool GradientSync::once_over_tp(const Parameter& p) const {
  return !p.shard.replicated() || parts_.grid.coords().tp == 0;
}

bool GradientSync::counts_in_norm(const Parameter& p) const {
  if (units_) return once_over_tp(p) && !(pair_ && holds_head_ && p.name == "wte");
  if (p.name == "wte" && tied_ && tied_->updates_table()) return false;  // the first stage's copy counts
  return once_over_tp(p);
}

bool GradientSync::writes_moments(const Parameter& p) const {
  if (units_ && pair_ && p.name == "wte") return holds_head_ && once_over_tp(p);
  if (tied_ && p.name == "wte") return tied_->updates_table() && once_over_tp(p);
  return counts_in_norm(p);
}

double GradientSync::local_squares() {
  const auto counts = [this](const Parameter& p) { return counts_in_norm(p); };
  ParameterStore& params = parts_.params;
  Backend& backend = parts_.backend;
  double sq = 0;
  if (units_) {  // each rank its parts (the first shard group's, where groups repeat them)
    if (units_->first_group())
      units_->for_each([&](Parameter& p, const UnitShards::Piece& x) {
        if (counts(p)) sq += backend.sum_squares(x.grad, static_cast<size_t>(x.hi - x.lo));
      });
    return sq;
  }
  if (shards_) {  // ZeRO-1: each rank holds the reduced gradients of its ranges
    const float* g = params.grads().f32();
    for (const auto& r : shards_->ranges()) sq += backend.sum_squares(g + r.lo, static_cast<size_t>(r.hi - r.lo));
    shards_->for_each(params, [&](const Parameter& p, int64_t lo, int64_t hi, const OptimizerShards::Range&) {
      if (!counts(p)) sq -= backend.sum_squares(g + lo, static_cast<size_t>(hi - lo));
    });
    return sq;
  }
  // Runs of adjacent counted parameters (with the zero padding between them), so the
  // parameters that do not count are never read: the last stage's wte.grad may still
  // be receiving the tied sum.
  std::vector<const Parameter*> order;
  for (const auto& p : params.params()) order.push_back(&p);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  int64_t lo = -1, hi = -1;
  auto close = [&] {
    if (lo >= 0) sq += backend.sum_squares(params.grads().f32() + lo, static_cast<size_t>(hi - lo));
    lo = -1;
  };
  for (const Parameter* p : order) {
    if (!counts(*p) || p->expert_parallel) {
      close();
      continue;
    }
    if (lo < 0) lo = p->offset;
    hi = p->offset + p->numel();
  }
  close();
  return sq;
}

double GradientSync::local_expert_squares() {
  double sq = 0;
  if (shards_ || units_) return sq;  // local_squares counts the owned ranges, expert parts included
  for (const auto& p : parts_.params.params())
    if (p.expert_parallel) sq += parts_.backend.sum_squares(p.grad.f32(), static_cast<size_t>(p.numel()));
  return sq;
}

void GradientSync::update(AdamW& optimizer, int step, double lr, float grad_scale) {
  fault::point("optimizer");
  ParameterStore& params = parts_.params;
  Backend& backend = parts_.backend;
  if (units_) return update_units(step, lr, grad_scale);
  Parameter* wte = tied_ ? params.find("wte") : nullptr;  // the tied table: updated on the last stage only
  if (!shards_) {
    if (tied_) {
      tied_->receive_sum();
      // The table before the rest, so its new values travel while the rest is updated.
      if (tied_->updates_table()) optimizer.update(*wte, backend, step + 1, lr, grad_scale);
      tied_->start_values();  // the last stage sends the new table, the first posts its receive
    }
    optimizer.step(params, backend, step + 1, lr, grad_scale, wte);
    if (tied_) tied_->finish_values();
    params.refresh_compute(parts_.pool, backend);
    return;
  }
  // ZeRO-1: update this rank's ranges, then gather every rank's new values.
  shards_->adamw(params, backend, parts_.cfg.train, step + 1, lr, grad_scale,
                 [&](const Parameter& p) { return p.trained && !(&p == wte && !tied_->updates_table()); });
  gather(params.values(), params.values());
  if (tied_) {  // after the gather: it carries the first stage's stale copy of the table
    tied_->start_values();
    tied_->finish_values();
  }
  params.refresh_compute(parts_.pool, backend);
}

// Each rank its parts; under "gradients" every unit's new values gathered after (the whole
// weights stay), under "weights" the parts are the weights.
void GradientSync::update_units(int step, double lr, float grad_scale) {
  Backend& backend = parts_.backend;
  units_->for_each([&](Parameter& p, const UnitShards::Piece& x) {
    if (p.trained)
      adamw_elements(backend, parts_.cfg.train, p, x.value, x.grad, x.m, x.v, static_cast<size_t>(x.hi - x.lo),
                     step + 1, lr, grad_scale);
  });
  if (units_->shards_weights()) return units_->refresh_bf16();
  units_->gather_values();
  parts_.params.refresh_compute(parts_.pool, backend);
}

std::vector<float> GradientSync::reduced_gradients() {
  ParameterStore& params = parts_.params;
  if (units_) return units_->whole_gradients();
  if (tied_) tied_->receive_sum();
  std::vector<float> out(static_cast<size_t>(params.numel()));
  if (!shards_) {
    parts_.backend.to_host(out.data(), params.grads().raw(), out.size() * sizeof(float));
    return out;
  }
  Tensor all = Tensor::empty(parts_.pool, {params.numel()});
  gather(params.grads(), all);
  parts_.backend.to_host(out.data(), all.raw(), out.size() * sizeof(float));
  return out;
}

}  // namespace pipetrain
