#include "pipetrain/model/parameters.hpp"

#include <algorithm>
#include <vector>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/core/rng.hpp"

namespace pipetrain {

int64_t Parameter::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

Parameter& ParameterStore::declare(const std::string& name, std::vector<int64_t> shape, Init init,
                                   double init_std) {
  return declare_shard(name, shape, Shard{}, init, init_std);
}

Parameter& ParameterStore::declare_shard(const std::string& name, std::vector<int64_t> global_shape,
                                         Shard shard, Init init, double init_std) {
  std::vector<int64_t> shape = local_shape(global_shape, shard);
  if (Parameter* p = find(name)) {
    if (p->shape != shape) fail("parameter {} declared twice with different shapes", name);
    return *p;
  }
  if (values_.defined()) fail("parameter {} declared after allocation", name);
  Parameter& p = params_.emplace_back();
  p.name = name;
  p.shape = std::move(shape);
  p.global_shape = std::move(global_shape);
  p.shard = std::move(shard);
  p.init = init;
  p.init_std = init_std;
  // Keep every parameter 16-float aligned inside the flat buffers.
  p.offset = total_;
  total_ += (p.numel() + 15) / 16 * 16;
  return p;
}

int64_t ParameterStore::count() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p.numel();
  return n;
}

int64_t ParameterStore::not_updated() const {
  int64_t n = 0;
  for (const auto& p : params_)
    if (!p.updated) n += p.numel();
  return n;
}

Parameter* ParameterStore::find(const std::string& name) {
  for (auto& p : params_)
    if (p.name == name) return &p;
  return nullptr;
}

void ParameterStore::allocate(MemoryPool& pool, Backend& backend, const FlatLayout& layout) {
  const auto padded = [](int64_t n, int64_t align) { return (n + align - 1) / align * align; };
  int64_t at = 0;  // every parameter 16-float aligned
  const bool units = layout.unit_align > 0;
  int64_t kept = 0;  // under units: the run of the parameters in none, first (kept whole on every rank)
  for (const bool experts : {false, true}) {
    for (auto& p : params_)
      if (units && p.expert_parallel == experts && p.unit < 0) {
        if (experts) fail("parameter {}: an expert-parallel parameter belongs to no unit", p.name);
        p.offset = at;
        at += padded(p.numel(), 16);
      }
    if (units && !experts) kept = at = padded(at, layout.unit_align);
    int unit = -1;
    for (auto& p : params_)
      if (p.expert_parallel == experts && (!units || p.unit >= 0)) {
        if (units && p.unit != unit) {  // a unit's run starts and ends aligned
          if (p.unit < unit)
            fail("parameter {}: its unit {} comes after unit {} (units are declared in order)", p.name, p.unit, unit);
          at = padded(at, layout.unit_align);
          unit = p.unit;
        }
        p.offset = at;
        at += padded(p.numel(), 16);
      }
    if (units) at = padded(at, layout.unit_align);
    if (!experts) at = expert_begin_ = std::max(padded(at, layout.align), layout.align);
  }
  total_ = expert_begin_ + padded(at - expert_begin_, layout.expert_align);
  const bool moments = layout.moments, grads = layout.grads;
  const int64_t n = total_;
  if (layout.values || kept > 0) values_ = Tensor::empty(pool, {layout.values ? n : kept});
  if (grads) grads_ = Tensor::empty(pool, {n});
  int64_t moments_n = 0;  // the updated parameters', each 16-float aligned as in the flat buffers
  for (auto& p : params_)
    if (p.updated) {
      p.moment_offset = moments_n;
      moments_n += (p.numel() + 15) / 16 * 16;
    }
  if (moments && moments_n > 0) {
    m_ = Tensor::empty(pool, {moments_n});
    v_ = Tensor::empty(pool, {moments_n});
  }
  for (const Tensor* t : {&values_, &grads_, &m_, &v_})
    if (t->defined()) backend.fill(t->f32(), 0.0f, static_cast<size_t>(t->numel()));
  for (auto& p : params_) {
    if (layout.values || (units && p.unit < 0)) p.value = values_.view(p.offset, p.shape);
    if (grads) p.grad = grads_.view(p.offset, p.shape);
    if (moments && p.updated) {
      p.m = m_.view(p.moment_offset, p.shape);
      p.v = v_.view(p.moment_offset, p.shape);
    }
  }
}

void ParameterStore::initialize(uint64_t seed, Backend& backend) {
  for (auto& p : params_) initialize(p, seed, backend);
}

void ParameterStore::initialize(Parameter& p, uint64_t seed, Backend& backend) {
  int64_t global_n = 1;
  for (auto d : p.global_shape) global_n *= d;
  std::vector<float> host(static_cast<size_t>(global_n), 0.0f);
  if (p.init == Init::Ones) {
    host.assign(host.size(), 1.0f);
  } else if (p.init == Init::Normal) {
    Rng rng = Rng::for_stream(seed, p.name);
    const size_t row = static_cast<size_t>(global_n / p.global_shape[0]);
    const size_t n = p.init_rows < 0 ? host.size() : static_cast<size_t>(p.init_rows) * row;
    for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>(rng.normal() * p.init_std);
  }
  const std::vector<float> local = extract_shard(host, p.global_shape, p.shard);
  backend.to_device(p.value.raw(), local.data(), local.size() * sizeof(float));
}

bool ParameterStore::needs_widened_copy(const Parameter& p, bool native_bf16_products) {
  return !native_bf16_products || p.shape.size() == 1 || p.f32_products;
}

void ParameterStore::allocate_compute(MemoryPool& pool, Backend& backend) {
  compute_bf16_ = Tensor::empty(pool, {total_}, DType::BF16);
  const bool native = backend.bf16_products_native();
  int64_t widened = 0;  // each 16-float aligned, in the flat buffers' order
  for (Parameter* q : in_flat_order()) {
    Parameter& p = *q;
    p.compute_bf16 = compute_bf16_.view(p.offset, p.shape);
    p.compute_offset = -1;
    if (needs_widened_copy(p, native)) {
      p.compute_offset = widened;
      widened += (p.numel() + 15) / 16 * 16;
    }
  }
  compute_ = Tensor::empty(pool, {std::max<int64_t>(widened, 16)});
  for (auto& p : params_) p.compute = p.compute_offset < 0 ? Tensor{} : compute_.view(p.compute_offset, p.shape);
  refresh_compute(pool, backend);
}

void ParameterStore::refresh_compute(MemoryPool& /*pool*/, Backend& backend) {
  if (!compute_bf16_.defined()) return;
  backend.cast_to_bf16(compute_bf16_.bf16_data(), values_.f32(), static_cast<size_t>(total_));
  // The widened copies: consecutive widened parameters mostly lie alike in both buffers
  // (the same order and alignment), so each such run of them is one cast, padding included.
  const Parameter* run = nullptr;
  int64_t run_n = 0;
  auto flush = [&] {
    if (run) backend.cast_to_f32(run->compute.f32(), run->compute_bf16.bf16_data(), static_cast<size_t>(run_n));
    run = nullptr;
  };
  for (const Parameter* p : in_flat_order()) {
    if (run && (p->compute_offset < 0 || p->compute_offset - run->compute_offset != p->offset - run->offset)) flush();
    if (p->compute_offset < 0) continue;
    if (!run) run = p;
    run_n = p->offset - run->offset + p->numel();
  }
  flush();
}

std::vector<Parameter*> ParameterStore::in_flat_order() {
  std::vector<Parameter*> order;
  for (auto& p : params_) order.push_back(&p);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  return order;
}

void ParameterStore::zero_grads(Backend& backend) {
  if (grads_.defined()) backend.fill(grads_.f32(), 0.0f, static_cast<size_t>(grads_.numel()));
}

}  // namespace pipetrain
