// Every layer's backward (input and weight gradients) against central finite
// differences of its forward, along random directions: for a scalar probe
// L = sum(R * y), checks dL/dx . d and dL/dW . d for each parameter tensor W.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "model_fixtures.hpp"
#include "pipetrain/model/stage.hpp"
#include "pipetrain/model/block.hpp"
#include "pipetrain/model/embedding.hpp"
#include "pipetrain/model/stage.hpp"
#include "pipetrain/model/llama_block.hpp"
#include "pipetrain/model/loss_head.hpp"

namespace pipetrain {
namespace {

using testing::dot;
using testing::random_tensor;
using testing::random_tokens;

class LayerGradient : public ::testing::Test {
 protected:
  void SetUp() override {
    backend = make_cpu_backend();
    pool = MemoryPool::create(*backend);
    cfg = testing::tiny_model();
    ctx.backend = backend.get();
    ctx.pool = pool.get();
    ctx.B = 2;
    ctx.T = 5;
    ctx.tokens = random_tokens(*pool, ctx.B * ctx.T, cfg.vocab_size, 11);
    ctx.targets = random_tokens(*pool, ctx.B * ctx.T, cfg.vocab_size, 12);
  }

  // Scalar probe of a layer's output.
  double probe(Layer& layer, const Tensor& x, const Tensor& R) {
    std::unique_ptr<Stash> stash;
    Tensor y = layer.forward(ctx, x, stash);
    if (!R.defined()) {  // loss head: L = loss_scale * sum(losses)
      double s = 0;
      for (int64_t i = 0; i < y.numel(); ++i) s += y.f32()[i];
      return s * ctx.loss_scale;
    }
    return dot(y.f32(), R.f32(), y.numel());
  }

  // Checks analytic gradients of `layer` (params in `store`) against finite differences.
  void check(Layer& layer, ParameterStore& store, Tensor x, Tensor R) {
    store.allocate(*pool, *backend);
    store.initialize(5, *backend);
    // Perturb LayerNorm/bias parameters away from 1/0 so their gradients are generic.
    for (auto& p : store.params()) {
      Rng rng = Rng::for_stream(9, p.name);
      for (int64_t i = 0; i < p.numel(); ++i) p.value.f32()[i] += static_cast<float>(0.1 * rng.normal());
    }
    store.zero_grads(*backend);
    std::unique_ptr<Stash> stash;
    layer.forward(ctx, x, stash);
    Tensor dx = layer.backward(ctx, R, *stash);
    stash.reset();

    const float eps = 1e-2f;
    auto directional = [&](float* data, int64_t n, const float* grad, uint64_t seed) {
      std::vector<float> dir(static_cast<size_t>(n)), saved(data, data + n);
      Rng rng(seed);
      for (auto& d : dir) d = static_cast<float>(rng.normal());
      auto shifted = [&](float s) {
        for (int64_t i = 0; i < n; ++i) data[i] = saved[static_cast<size_t>(i)] + s * dir[static_cast<size_t>(i)];
        return probe(layer, x, R);
      };
      const double fd = (shifted(eps) - shifted(-eps)) / (2.0 * eps);
      for (int64_t i = 0; i < n; ++i) data[i] = saved[static_cast<size_t>(i)];
      const double an = dot(grad, dir.data(), n);
      return std::pair{fd, an};
    };
    if (x.defined()) {
      auto [fd, an] = directional(x.f32(), x.numel(), dx.f32(), 21);
      EXPECT_NEAR(an, fd, 2e-2 * std::abs(fd) + 1e-4) << layer.name() << " input gradient";
    }
    for (auto& p : store.params()) {
      auto [fd, an] = directional(p.value.f32(), p.numel(), p.grad.f32(), stable_hash(p.name));
      EXPECT_NEAR(an, fd, 2e-2 * std::abs(fd) + 1e-4) << layer.name() << " gradient of " << p.name;
    }
  }

  std::unique_ptr<Backend> backend;
  std::shared_ptr<MemoryPool> pool;
  ModelConfig cfg;
  MicrobatchContext ctx;
};

TEST_F(LayerGradient, Embedding) {
  ParameterStore store;
  Embedding layer(cfg, store);
  check(layer, store, {}, random_tensor(*pool, {ctx.B * ctx.T, cfg.d_model}, 3));
}

TEST_F(LayerGradient, Block) {
  ParameterStore store;
  Block layer(cfg, 0, store);
  const int N = ctx.B * ctx.T;
  check(layer, store, random_tensor(*pool, {N, cfg.d_model}, 4),
        random_tensor(*pool, {N, cfg.d_model}, 3));
}

TEST_F(LayerGradient, LossHead) {
  ParameterStore store;
  LossHead layer(cfg, store);
  ctx.loss_scale = 1.0f / static_cast<float>(ctx.B * ctx.T);
  check(layer, store, random_tensor(*pool, {ctx.B * ctx.T, cfg.d_model}, 4), {});
}

// Llama's layers: grouped-query attention (4 query heads on 2 key/value heads), RoPE,
// SwiGLU, RMSNorm; the token embedding without positions and the untied head.
ModelConfig tiny_llama() {
  ModelConfig m = testing::tiny_model();
  m.arch = "llama";
  m.n_head = 4;
  m.n_kv_head = 2;
  m.d_model = 16;
  m.ffn_hidden = 24;
  m.rope_theta = 10000;
  return m;
}

TEST_F(LayerGradient, LlamaBlock) {
  cfg = tiny_llama();
  ParameterStore store;
  LlamaBlock layer(cfg, 0, store);
  const int N = ctx.B * ctx.T;
  check(layer, store, random_tensor(*pool, {N, cfg.d_model}, 4), random_tensor(*pool, {N, cfg.d_model}, 3));
}

TEST_F(LayerGradient, LlamaEmbeddingAndUntiedHead) {
  cfg = tiny_llama();
  {
    ParameterStore store;
    Embedding layer(cfg, store);
    EXPECT_EQ(layer.parameters().size(), 1u) << "Llama has no position table";
    check(layer, store, {}, random_tensor(*pool, {ctx.B * ctx.T, cfg.d_model}, 3));
  }
  ParameterStore store;
  LossHead layer(cfg, store);
  EXPECT_NE(store.find("lm_head.w"), nullptr);
  EXPECT_EQ(store.find("wte"), nullptr);
  ctx.loss_scale = 1.0f / static_cast<float>(ctx.B * ctx.T);
  check(layer, store, random_tensor(*pool, {ctx.B * ctx.T, cfg.d_model}, 4), {});
}

// Deferring weight gradients (F0 F1 I0 I1 W1 W0, as zero-bubble schedules do) gives
// the same gradients as running each microbatch's backward at once.
TEST_F(LayerGradient, DeferredWeightGradientsMatchFusedBackward) {
  ParameterStore a, b;
  Block la(cfg, 0, a), lb(cfg, 0, b);
  for (ParameterStore* s : {&a, &b}) {
    s->allocate(*pool, *backend);
    s->initialize(5, *backend);
  }
  const int N = ctx.B * ctx.T;
  Tensor x0 = random_tensor(*pool, {N, cfg.d_model}, 1), x1 = random_tensor(*pool, {N, cfg.d_model}, 2);
  Tensor r0 = random_tensor(*pool, {N, cfg.d_model}, 3), r1 = random_tensor(*pool, {N, cfg.d_model}, 4);
  std::unique_ptr<Stash> s0, s1;
  la.forward(ctx, x0, s0);
  Tensor dxa0 = la.backward(ctx, r0, *s0);
  la.forward(ctx, x1, s1);
  Tensor dxa1 = la.backward(ctx, r1, *s1);
  lb.forward(ctx, x0, s0);
  lb.forward(ctx, x1, s1);
  Tensor dxb0 = lb.backward_input(ctx, r0, *s0);
  Tensor dxb1 = lb.backward_input(ctx, r1, *s1);
  lb.backward_weight(ctx, *s1);
  lb.backward_weight(ctx, *s0);
  for (int64_t i = 0; i < dxa0.numel(); ++i) {
    ASSERT_EQ(dxa0.f32()[i], dxb0.f32()[i]);
    ASSERT_EQ(dxa1.f32()[i], dxb1.f32()[i]);
  }
  for (size_t k = 0; k < a.params().size(); ++k) {
    const Parameter& pa = a.params()[k];
    const Parameter& pb = b.params()[k];
    for (int64_t i = 0; i < pa.numel(); ++i)
      ASSERT_NEAR(pa.grad.f32()[i], pb.grad.f32()[i], 1e-6 * (1 + std::abs(pa.grad.f32()[i])))
          << pa.name;
  }
}

}  // namespace
}  // namespace pipetrain
