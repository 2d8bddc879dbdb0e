#include "pipetrain/runtime/unit_shards.hpp"

#include <algorithm>
#include <chrono>

#include "pipetrain/core/error.hpp"

namespace pipetrain {

UnitShards::UnitShards(ParameterStore& params, RankUnits units, Groups groups, bool weights, MemoryPool& pool,
                       Backend& backend, bool bf16)
    : params_(params),
      across_(groups.across),
      weights_(weights),
      bf16_(bf16 && weights),
      pool_(pool),
      backend_(backend) {
  int64_t at = 0;
  std::vector<std::pair<int64_t, int64_t>> runs;  // every unit's [lo, hi), to check they do not overlap
  for (size_t i = 0; i < units.units.size(); ++i) {
    Unit u;
    u.ref = units.units[i];
    u.params = units.params[i];
    if (u.params.empty()) fail("sharded data parallelism: unit {}.{} has no parameters", u.ref.stage, u.ref.unit);
    const bool experts = u.params.front()->expert_parallel;
    if (experts && !groups.experts)
      fail("sharded data parallelism: unit {}.{} holds experts but no group shards them", u.ref.stage, u.ref.unit);
    u.group = experts ? groups.experts : &groups.dense;
    const int64_t align = 16 * static_cast<int64_t>(u.group->size());
    u.lo = u.params.front()->offset;
    const Parameter* last = u.params.back();
    u.hi = (last->offset + last->numel() + align - 1) / align * align;
    for (const Parameter* p : u.params)
      if (p->unit != static_cast<int>(i) || p->offset < u.lo || p->offset + p->numel() > u.hi ||
          p->expert_parallel != experts)
        fail("sharded data parallelism: parameter {} lies outside its unit {}.{}'s run of the flat buffers", p->name,
             u.ref.stage, u.ref.unit);
    if (u.lo % align != 0)
      fail("sharded data parallelism: unit {}.{} does not start on its own aligned run", u.ref.stage, u.ref.unit);
    runs.push_back({u.lo, u.hi});
    u.at = at;
    at += part(u);
    index_[u.ref] = static_cast<int>(units_.size());
    units_.push_back(std::move(u));
  }
  std::sort(runs.begin(), runs.end());
  for (size_t i = 1; i < runs.size(); ++i)
    if (runs[i].first < runs[i - 1].second) fail("sharded data parallelism: two units share a run of the flat buffers");
  for (const auto& [s, layers] : units.layers)
    for (size_t l = 0; l < layers.size(); ++l)
      for (const UnitRef& r : layers[l]) layers_[{s, static_cast<int>(l)}].push_back(index_.at(r));
  const int64_t n = std::max<int64_t>(at, 16);
  for (Tensor* t : {&g_, &m_, &v_}) {
    *t = Tensor::empty(pool, {n});
    backend.fill(t->f32(), 0.0f, static_cast<size_t>(n));
  }
  if (weights) {
    w_ = Tensor::empty(pool, {n});
    backend.fill(w_.f32(), 0.0f, static_cast<size_t>(n));
  }
  if (bf16_) {
    wb_ = Tensor::empty(pool, {n}, DType::BF16);
    refresh_bf16();
  }
  for (auto& p : params.params()) p.grad = Tensor{};  // each unit's, while open
}

void UnitShards::initialize(uint64_t seed) {
  for (Unit& u : units_) {
    u.whole_w = Tensor::empty(pool_, {u.hi - u.lo});
    backend_.fill(u.whole_w.f32(), 0.0f, static_cast<size_t>(u.hi - u.lo));
    for (Parameter* p : u.params) {
      p->value = u.whole_w.view(p->offset - u.lo, p->shape);
      ParameterStore::initialize(*p, seed, backend_);
    }
    backend_.copy(w_.f32() + u.at, u.whole_w.f32() + (part_lo(u) - u.lo), static_cast<size_t>(part(u)) * sizeof(float));
    free_weights(u);
  }
  refresh_bf16();
}

void UnitShards::refresh_bf16() {
  if (bf16_) backend_.cast_to_bf16(wb_.bf16_data(), w_.f32(), static_cast<size_t>(w_.numel()));
}

void UnitShards::post_gather(Unit& u, bool values) {
  const bool alone = in_place(u);  // its part is the whole: the parameters point into it
  if (!values) {
    u.whole_b = alone ? wb_.view(u.at, {u.hi - u.lo}) : Tensor::empty(pool_, {u.hi - u.lo}, DType::BF16);
    bind_bf16(u);
    if (alone) return widen(u);
    u.gather = u.group->all_gather(wb_.view(u.at, {part(u)}), u.whole_b, backend_.stream());
    return;
  }
  u.whole_w = alone ? w_.view(u.at, {u.hi - u.lo}) : Tensor::empty(pool_, {u.hi - u.lo});
  for (Parameter* p : u.params) p->value = u.whole_w.view(p->offset - u.lo, p->shape);
  if (!alone) u.gather = u.group->all_gather(w_.view(u.at, {part(u)}), u.whole_w, backend_.stream());
}

void UnitShards::end_gather(Unit& u) {
  if (!u.gather) return;
  u.gather->wait();
  u.gather.reset();
  if (u.whole_b.defined()) widen(u);
}

void UnitShards::bind_bf16(Unit& u) {
  for (Parameter* p : u.params) p->compute_bf16 = u.whole_b.view(p->offset - u.lo, p->shape);
}

void UnitShards::widen(Unit& u) {
  const bool native = backend_.bf16_products_native();
  for (Parameter* p : u.params)
    if (ParameterStore::needs_widened_copy(*p, native)) {
      p->compute = Tensor::empty(pool_, p->shape);
      backend_.cast_to_f32(p->compute.f32(), p->compute_bf16.bf16_data(), static_cast<size_t>(p->numel()));
    }
}

void UnitShards::free_weights(Unit& u) {
  if (u.gather) u.gather->wait();
  u.gather.reset();
  for (Parameter* p : u.params) p->value = p->compute = p->compute_bf16 = Tensor{};
  u.whole_w = u.whole_b = Tensor{};
}

void UnitShards::open_gradient(Unit& u) {
  u.whole_g = in_place(u) ? g_.view(u.at, {u.hi - u.lo}) : Tensor::empty(pool_, {u.hi - u.lo});
  backend_.fill(u.whole_g.f32(), 0.0f, static_cast<size_t>(u.hi - u.lo));
  for (Parameter* p : u.params) p->grad = u.whole_g.view(p->offset - u.lo, p->shape);
}

void UnitShards::close_gradient(Unit& u) {
  for (Parameter* p : u.params) p->grad = Tensor{};
  u.whole_g = Tensor{};
}

void UnitShards::post_scatter(Unit& u) {
  if (in_place(u)) return close_gradient(u);  // (summed in its part already)
  const int64_t k = part(u), d = u.group->size(), q = std::max<int64_t>(16, kScatterChunk / d);
  for (int64_t t = 0; t < k; t += q) {  // chunk t: each rank's piece [t, t + n) of its part
    const int64_t n = std::min(q, k - t);
    Tensor stage = Tensor::empty(pool_, {d * n});
    for (int64_t r = 0; r < d; ++r)
      backend_.copy(stage.f32() + r * n, u.whole_g.f32() + r * k + t, static_cast<size_t>(n) * sizeof(float));
    u.scatter.push_back(u.group->reduce_scatter_sum(stage, g_.view(u.at + t, {n}), backend_.stream()));
    u.staging.push_back(std::move(stage));
  }
  close_gradient(u);
}

bool UnitShards::scatter_done(Unit& u) {
  for (auto& r : u.scatter)
    if (!r->test()) return false;
  u.scatter.clear();
  u.staging.clear();
  return true;
}

void UnitShards::end_scatter(Unit& u) {
  for (auto& r : u.scatter) r->wait();
  u.scatter.clear();
  u.staging.clear();
}

void UnitShards::run(const Instr& in) {
  const auto it = index_.find({in.stage, in.unit});
  if (it == index_.end()) fail("{}: unit {}.{} is not on this rank", to_string(in), in.stage, in.unit);
  Unit& u = units_[static_cast<size_t>(it->second)];
  switch (in.shard) {
    case ShardOp::GatherW:
      if (!weights_ || gathered(u)) fail("{}: the unit's weights are not sharded, or already gathered", to_string(in));
      post_gather(u, !bf16_);
      return;
    case ShardOp::FreeW:
      free_weights(u);
      return;
    case ShardOp::ReduceScatterG:
      if (!u.whole_g.defined()) fail("{}: no work wrote the unit's gradient this step", to_string(in));
      post_scatter(u);
      scattering_.push_back(it->second);
      while (scattering_.size() > static_cast<size_t>(kScattersInFlight)) {  // its buffers bound the memory
        end_scatter(units_[static_cast<size_t>(scattering_.front())]);
        scattering_.pop_front();
      }
      return;
  }
}

void UnitShards::layer_work(int stage, int layer, bool reads, bool writes) {
  const auto it = layers_.find({stage, layer});
  if (it == layers_.end()) return;
  for (int i : it->second) {
    Unit& u = units_[static_cast<size_t>(i)];
    if (reads && weights_) {
      if (!gathered(u))
        fail("stage {}, layer {}: reads unit {}.{}, which is not gathered", stage, layer, u.ref.stage, u.ref.unit);
      if (u.gather) {
        const auto t0 = std::chrono::steady_clock::now();
        end_gather(u);
        gather_wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
    }
    if (writes && !u.whole_g.defined()) {
      if (!u.scatter.empty())
        fail("stage {}, layer {}: writes unit {}.{}'s gradient after its reduce-scatter", stage, layer, u.ref.stage,
             u.ref.unit);
      open_gradient(u);
    }
  }
}

void UnitShards::poll() {
  while (!scattering_.empty()) {
    if (!scatter_done(units_[static_cast<size_t>(scattering_.front())])) return;
    scattering_.pop_front();
  }
}

void UnitShards::finish() {
  scattering_.clear();
  for (Unit& u : units_) {
    end_scatter(u);
    if (u.whole_g.defined()) fail("unit {}.{}: its gradient was never reduce-scattered", u.ref.stage, u.ref.unit);
  }
  if (across_ && across_->size() > 1) across_->allreduce_sum(g_, backend_.stream())->wait();
}

UnitShards::Piece UnitShards::piece(const Parameter& p) {
  Piece out;
  if (p.unit < 0 || static_cast<size_t>(p.unit) >= units_.size()) return out;
  const Unit& u = units_[static_cast<size_t>(p.unit)];
  const int64_t a = part_lo(u), b = a + part(u);
  out.lo = std::max(a, p.offset);
  out.hi = std::max(out.lo, std::min(b, p.offset + p.numel()));
  const int64_t at = u.at + (out.lo - a);
  out.grad = g_.f32() + at;
  out.m = m_.f32() + at;
  out.v = v_.f32() + at;
  out.value = weights_ ? w_.f32() + at : params_.values().f32() + out.lo;
  return out;
}

void UnitShards::for_each(const std::function<void(Parameter&, const Piece&)>& f) {
  for (Unit& u : units_)
    for (Parameter* p : u.params)
      if (const Piece x = piece(*p); x.hi > x.lo) f(*p, x);
}

Tensor UnitShards::grad_part(const Parameter& p) {
  const Piece x = piece(p);
  if (x.hi <= x.lo) return {};
  return g_.view(x.grad - g_.f32(), {x.hi - x.lo});
}

void UnitShards::gather_values() {
  std::vector<std::unique_ptr<CommRequest>> parts;
  for (Unit& u : units_)
    if (!in_place(u))
      parts.push_back(u.group->all_gather(params_.values().view(part_lo(u), {part(u)}),
                                          params_.values().view(u.lo, {u.hi - u.lo}), backend_.stream()));
  for (auto& r : parts) r->wait();
}

void UnitShards::gather_all() {
  for (Unit& u : units_) {
    if (u.whole_w.defined()) continue;
    free_weights(u);  // (bf16: the values too, and the copies made from them)
    post_gather(u, true);
  }
  for (Unit& u : units_) {
    end_gather(u);
    if (!bf16_ || u.whole_b.defined()) continue;
    u.whole_b = Tensor::empty(pool_, {u.hi - u.lo}, DType::BF16);  // the copies, from the values
    backend_.cast_to_bf16(u.whole_b.bf16_data(), u.whole_w.f32(), static_cast<size_t>(u.hi - u.lo));
    bind_bf16(u);
    widen(u);
  }
}

std::vector<float> UnitShards::whole_gradients() {
  std::vector<float> out(static_cast<size_t>(params_.numel()), 0.0f);
  for (Unit& u : units_) {
    Tensor whole = Tensor::empty(pool_, {u.hi - u.lo});
    u.group->all_gather(g_.view(u.at, {part(u)}), whole, backend_.stream())->wait();
    backend_.to_host(out.data() + u.lo, whole.raw(), whole.bytes());
  }
  return out;
}

}  // namespace pipetrain
