// measure_unit_costs() of pipetrain/runtime/unit_costs.hpp.
#include "pipetrain/runtime/unit_costs.hpp"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <vector>

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

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

UnitTimings operator+(const UnitTimings& a, const UnitTimings& b) {
  return {a.forward + b.forward, a.backward_input + b.backward_input, a.backward_weight + b.backward_weight};
}

void keep_fastest(UnitTimings& best, const UnitTimings& u) {
  best.forward = std::min(best.forward, u.forward);
  best.backward_input = std::min(best.backward_input, u.backward_input);
  best.backward_weight = std::min(best.backward_weight, u.backward_weight);
}

}  // namespace

MeasuredUnits time_units_here(const ModelConfig& model, Backend& backend, int B, int T, DType storage) {
  auto pool = MemoryPool::create(backend);
  // Embedding, one block's two halves (of the model's architecture), head: two stages of
  // a one-block model, so that each half is a layer of its own.
  ParameterStore front_params, back_params;
  ModelConfig one = model;
  one.n_layer = 1;
  ModelStage front(one, 0, 2, front_params), back(one, 2, model_num_units(one), back_params);
  for (ParameterStore* params : {&front_params, &back_params}) {
    params->allocate(*pool, backend);
    params->initialize(1, backend);
    if (storage == DType::BF16) params->allocate_compute(*pool, backend);
  }
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
  Layer &embedding = *front.layers()[0], &attention = *front.layers()[1], &mlp = *back.layers()[0],
        &head = *back.layers()[1];
  // A warm-up (it also fills the pool), then rounds of the four units in turn: each
  // action's fastest, and the median of each round's ratios. On a machine whose speed
  // drifts over seconds (a shared VM), measured one unit after the other, GPT-2 124M's auto
  // split once came out 10,2, which takes a head measured above 7 blocks (it weighs 5.3);
  // the ratio of the fastest runs still put the head on either side of 5 blocks (9,3 or
  // 8,4) for two trainers of one process.
  constexpr double kNone = 1e300;
  constexpr int kRounds = 7;
  MeasuredUnits m{{kNone, kNone, kNone}, {kNone, kNone, kNone}, {kNone, kNone, kNone}};
  std::vector<double> e_ratio, h_ratio, a_ratio;
  {
    const HeldWeights held(backend);  // as in a program: products by packed weights where the run packs them
    for (int round = 0; round <= kRounds; ++round) {
      const UnitTimings e = time_layer(embedding, ctx, {}, dy), a = time_layer(attention, ctx, x, dy),
                        f = time_layer(mlp, ctx, x, dy), h = time_layer(head, ctx, x, {});
      if (round == 0) continue;
      const UnitTimings b = a + f;
      keep_fastest(m.embedding, e);
      keep_fastest(m.block, b);
      keep_fastest(m.head, h);
      e_ratio.push_back(e.total() / b.total());
      h_ratio.push_back(h.total() / b.total());
      a_ratio.push_back(a.total() / b.total());
    }
  }
  {  // An empty hold frees the packed copies of these stages' weights, which end here.
    const HeldWeights none(backend);
  }
  m.embedding_per_block = median_of(e_ratio);
  m.head_per_block = median_of(h_ratio);
  m.attention_share = median_of(a_ratio);
  return m;
}


UnitCosts measure_unit_costs(const ModelConfig& model, Backend& backend, Grid& grid, int B, int T, DType storage) {
  // Every rank measures at once; rank 0 takes the median over the ranks of the block's time
  // and of each ratio (a rank on a slower core moves them least) and broadcasts them.
  const MeasuredUnits u = time_units_here(model, backend, B, T, storage);
  constexpr int kValues = 4;
  const double mine[kValues] = {u.block.total(), u.embedding_per_block, u.head_per_block, u.attention_share};
  const MPI_Comm world = grid.world().comm();
  const auto ranks = static_cast<size_t>(grid.world().size());
  std::vector<double> all(grid.world().rank() == 0 ? kValues * ranks : 0);
  MPI_Gather(mine, kValues, MPI_DOUBLE, all.data(), kValues, MPI_DOUBLE, 0, world);
  double v[kValues] = {0, 0, 0, 0};
  if (grid.world().rank() == 0)
    for (int k = 0; k < kValues; ++k) {
      std::vector<double> of(ranks);
      for (size_t r = 0; r < ranks; ++r) of[r] = all[kValues * r + static_cast<size_t>(k)];
      v[k] = median_of(of);
    }
  MPI_Bcast(v, kValues, MPI_DOUBLE, 0, world);
  return {v[1] * v[0], v[0], v[2] * v[0], v[3]};
}

}  // namespace pipetrain
