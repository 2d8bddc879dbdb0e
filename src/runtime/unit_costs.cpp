// measure_unit_costs() of pipetrain/runtime/unit_costs.hpp.
#include "pipetrain/runtime/unit_costs.hpp"

#include <mpi.h>

#include <algorithm>
#include <chrono>

#include "pipetrain/core/rng.hpp"
#include "pipetrain/model/parameters.hpp"
#include "pipetrain/model/stage.hpp"

namespace pipetrain {

namespace {

// Seconds of each action of `layer`, one run.
UnitTimings time_layer(Layer& layer, const MicrobatchContext& ctx, const Tensor& x, const Tensor& dy) {
  using clock = std::chrono::steady_clock;
  auto since = [](clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); };
  UnitTimings u;
  std::unique_ptr<Stash> stash;
  auto t = clock::now();
  layer.forward(ctx, x, stash);
  u.forward = since(t);
  t = clock::now();
  layer.backward_input(ctx, dy, *stash);
  u.backward_input = since(t);
  t = clock::now();
  layer.backward_weight(ctx, *stash);
  u.backward_weight = since(t);
  return u;
}

void keep_fastest(UnitTimings& best, const UnitTimings& u) {
  best.forward = std::min(best.forward, u.forward);
  best.backward_input = std::min(best.backward_input, u.backward_input);
  best.backward_weight = std::min(best.backward_weight, u.backward_weight);
}

}  // namespace

MeasuredUnits time_units_here(const ModelConfig& model, Backend& backend, int B, int T, DType storage) {
  auto pool = MemoryPool::create(backend);
  ParameterStore params;
  ModelConfig one = model;  // embedding, one block (of the model's architecture), head
  one.n_layer = 1;
  ModelStage stage(one, 0, model_num_units(one), params);
  params.allocate(*pool, backend);
  params.initialize(1, backend);
  if (storage == DType::BF16) params.allocate_compute(*pool, backend);
  const int64_t N = static_cast<int64_t>(B) * T;
  MicrobatchContext ctx;
  ctx.backend = &backend;
  ctx.pool = pool.get();
  ctx.B = B;
  ctx.T = T;
  ctx.loss_scale = 1.0f / static_cast<float>(N);
  ctx.storage = storage;
  std::vector<int32_t> ids(static_cast<size_t>(N));
  Rng rng(7);
  for (auto& t : ids) t = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(model.vocab_size));
  ctx.tokens = Tensor::empty(*pool, {N}, DType::I32);
  ctx.targets = Tensor::empty(*pool, {N}, DType::I32);
  backend.to_device(ctx.tokens.raw(), ids.data(), ids.size() * sizeof(int32_t));
  backend.to_device(ctx.targets.raw(), ids.data(), ids.size() * sizeof(int32_t));
  // Activations and their gradients: small values in the storage dtype.
  auto activation = [&] {
    Tensor f = Tensor::empty(*pool, {N, model.d_model});
    backend.fill(f.f32(), 0.01f, static_cast<size_t>(f.numel()));
    if (storage == DType::F32) return f;
    Tensor h = Tensor::empty(*pool, f.shape(), DType::BF16);
    backend.cast_to_bf16(h.bf16_data(), f.f32(), static_cast<size_t>(f.numel()));
    return h;
  };
  const Tensor x = activation(), dy = activation();
  auto& layers = stage.layers();
  // A warm-up (it also fills the pool), then rounds of the three units in turn, each
  // action's fastest: on a machine whose speed drifts over seconds (a shared VM) every unit
  // gets the same chances, so the split sees their true ratio (measured one unit after
  // the other, GPT-2 124M's auto split once came out 10,2 on such a machine, which takes
  // a head measured above 7 blocks: it weighs 5.3).
  constexpr double kNone = 1e300;
  MeasuredUnits m{{kNone, kNone, kNone}, {kNone, kNone, kNone}, {kNone, kNone, kNone}};
  for (int round = 0; round < 4; ++round) {
    const UnitTimings e = time_layer(*layers[0], ctx, {}, dy), b = time_layer(*layers[1], ctx, x, dy),
                      h = time_layer(*layers[2], ctx, x, {});
    if (round == 0) continue;
    keep_fastest(m.embedding, e);
    keep_fastest(m.block, b);
    keep_fastest(m.head, h);
  }
  return m;
}


UnitCosts measure_unit_costs(const ModelConfig& model, Backend& backend, Grid& grid, int B, int T, DType storage) {
  double v[3] = {0, 0, 0};
  if (grid.world().rank() == 0) {
    const MeasuredUnits u = time_units_here(model, backend, B, T, storage);
    v[0] = u.embedding.total(), v[1] = u.block.total(), v[2] = u.head.total();
  }
  MPI_Bcast(v, 3, MPI_DOUBLE, 0, grid.world().comm());
  return {v[0], v[1], v[2]};
}

}  // namespace pipetrain
