// measure_unit_costs() of pipetrain/runtime/unit_costs.hpp.
#include "pipetrain/runtime/unit_costs.hpp"

#include <mpi.h>

#include <algorithm>
#include <chrono>

#include "pipetrain/core/rng.hpp"
#include "pipetrain/model/block.hpp"
#include "pipetrain/model/embedding.hpp"
#include "pipetrain/model/loss_head.hpp"
#include "pipetrain/model/parameters.hpp"

namespace pipetrain {

namespace {

// Seconds of forward + backward (input and weight) of `layer`, the faster of two runs
// after a warm-up (the first run also fills the pool).
double time_layer(Layer& layer, const MicrobatchContext& ctx, const Tensor& x, const Tensor& dy) {
  double best = 1e300;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    std::unique_ptr<Stash> stash;
    layer.forward(ctx, x, stash);
    layer.backward(ctx, dy, *stash);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) best = std::min(best, s);
  }
  return best;
}

UnitCosts measure_here(const ModelConfig& model, Backend& backend, int B, int T, DType storage) {
  auto pool = MemoryPool::create(backend);
  ParameterStore params;
  Embedding embedding(model, params);
  Block block(model, 1, params);
  LossHead head(model, params);
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
  UnitCosts c;
  c.embedding = time_layer(embedding, ctx, {}, dy);
  c.block = time_layer(block, ctx, x, dy);
  c.head = time_layer(head, ctx, x, {});
  return c;
}

}  // namespace

UnitCosts measure_unit_costs(const ModelConfig& model, Backend& backend, Grid& grid, int B, int T, DType storage) {
  double v[3] = {0, 0, 0};
  if (grid.world().rank() == 0) {
    const UnitCosts c = measure_here(model, backend, B, T, storage);
    v[0] = c.embedding, v[1] = c.block, v[2] = c.head;
  }
  MPI_Bcast(v, 3, MPI_DOUBLE, 0, grid.world().comm());
  return {v[0], v[1], v[2]};
}

}  // namespace pipetrain
