// Mixed precision (train.precision = "bf16") on the CPU: the casts, every layer in bf16
// against its f32 run within a bound counted from its rounding points, 100 training
// steps tracking f32, and the stashed activations taking about half the memory.
//
// The bounds: storing a value in bf16 rounds it to nearest with relative error at most
// u = 2^-9 (8 significant bits); K rounding points along the longest path from the
// inputs to a result move it by at most about K * u relative (first order), so a result
// is compared in relative L2 norm against K * 2^-8 (twice that, for the error each
// rounding's perturbation gains through the following ops). K is stated per result.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <string>

#include "model_fixtures.hpp"
#include "pipetrain/backend/backend.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/model/block.hpp"
#include "pipetrain/model/embedding.hpp"
#include "pipetrain/model/llama_block.hpp"
#include "pipetrain/model/loss_head.hpp"
#include "pipetrain/model/moe_mlp.hpp"
#include "pipetrain/model/precision.hpp"
#include "pipetrain/runtime/trainer.hpp"
#include "pipetrain/topology/grid.hpp"
#include "run_compare.hpp"

namespace pipetrain {
namespace {

const double kBf16 = std::ldexp(1.0, -8);

std::vector<float> host(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::BF16)
    for (size_t i = 0; i < v.size(); ++i) v[i] = to_float(t.bf16_data()[i]);
  else
    for (size_t i = 0; i < v.size(); ++i) v[i] = t.f32()[i];
  return v;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    n += static_cast<double>(b[i]) * b[i];
  }
  return n > 0 ? std::sqrt(d / n) : std::sqrt(d);
}

TEST(MixedPrecision, CastKernelsRoundToNearestEven) {
  auto be = make_cpu_backend();
  auto pool = MemoryPool::create(*be);
  const Tensor x = testing::random_tensor(*pool, {4099}, 3, 10.0);
  const float specials[] = {0.0f, -0.0f, 1.0f + std::ldexp(1.0f, -8), std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::max(), 1e-40f,
                            -std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::quiet_NaN(),
                            1.0f + 3 * std::ldexp(1.0f, -8), -std::numeric_limits<float>::max()};
  for (size_t i = 0; i < std::size(specials); ++i) x.f32()[i] = specials[i];
  const Tensor h = Tensor::empty(*pool, {4099}, DType::BF16), back = Tensor::empty(*pool, {4099});
  be->cast_to_bf16(h.bf16_data(), x.f32(), 4099);
  be->cast_to_f32(back.f32(), h.bf16_data(), 4099);
  for (int64_t i = 0; i < 4099; ++i) {
    ASSERT_EQ(h.bf16_data()[i].bits, to_bf16(x.f32()[i]).bits) << i;
    const float want = to_float(h.bf16_data()[i]);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(back.f32()[i]));
    } else {
      ASSERT_EQ(back.f32()[i], want) << i;
    }
  }
  // round_to_bf16: the same bf16, and x replaced by its rounded value, in one pass.
  const Tensor r = Tensor::empty(*pool, {4099}, DType::BF16);
  be->round_to_bf16(r.bf16_data(), x.f32(), 4099);
  for (int64_t i = 0; i < 4099; ++i) {
    ASSERT_EQ(r.bf16_data()[i].bits, h.bf16_data()[i].bits) << i;
    if (std::isnan(back.f32()[i])) {
      ASSERT_TRUE(std::isnan(x.f32()[i])) << i;
    } else {
      ASSERT_EQ(x.f32()[i], back.f32()[i]) << i;
    }
  }
}

class LayerInBf16 : public ::testing::Test {
 protected:
  void SetUp() override {
    backend = make_cpu_backend();
    pool = MemoryPool::create(*backend);
    cfg = testing::tiny_model();
    cfg.d_model = 64;
    cfg.n_head = 4;
    cfg.max_seq_len = 32;
    tokens = testing::random_tokens(*pool, B * T, cfg.vocab_size, 11);
    targets = testing::random_tokens(*pool, B * T, cfg.vocab_size, 12);
  }

  struct Result {
    std::vector<float> y, dx;
    std::map<std::string, std::vector<float>> grads;
  };

  // Forward and backward of a freshly built layer in `storage`; x and dy (f32, holding
  // bf16 values) are handed over in that storage.
  template <typename Make>
  Result run(Make make, DType storage, const Tensor& x, const Tensor& dy) {
    ParameterStore store;
    auto layer = make(store);
    store.allocate(*pool, *backend);
    store.initialize(5, *backend);
    for (auto& p : store.params()) {  // generic LayerNorm weights and biases
      Rng rng = Rng::for_stream(9, p.name);
      for (int64_t i = 0; i < p.numel(); ++i) p.value.f32()[i] += static_cast<float>(0.1 * rng.normal());
    }
    if (storage == DType::BF16) store.allocate_compute(*pool, *backend);
    MicrobatchContext ctx;
    ctx.backend = backend.get();
    ctx.pool = pool.get();
    ctx.B = B;
    ctx.T = T;
    ctx.tokens = tokens;
    ctx.targets = targets;
    ctx.loss_scale = 1.0f / static_cast<float>(B * T);
    ctx.storage = storage;
    auto in = [&](const Tensor& t) { return t.defined() ? layer_util_store(ctx, t) : t; };
    std::unique_ptr<Stash> stash;
    Result r;
    const Tensor y = layer->forward(ctx, in(x), stash);
    r.y = host(y);
    const Tensor dx = layer->backward(ctx, in(dy), *stash);
    if (dx.defined()) r.dx = host(dx);
    for (auto& p : store.params()) r.grads[p.name] = host(p.grad);
    return r;
  }

  // The stored form of f32 values that are already bf16-representable.
  static Tensor layer_util_store(const MicrobatchContext& ctx, const Tensor& t) {
    if (ctx.storage == DType::F32) return t;
    Tensor out = Tensor::empty(*ctx.pool, t.shape(), DType::BF16);
    ctx.backend->cast_to_bf16(out.bf16_data(), t.f32(), static_cast<size_t>(t.numel()));
    return out;
  }

  Tensor rounded(std::vector<int64_t> shape, uint64_t seed) {
    Tensor t = testing::random_tensor(*pool, std::move(shape), seed);
    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = to_float(to_bf16(t.f32()[i]));
    return t;
  }

  template <typename Make>
  void compare(Make make, const Tensor& x, const Tensor& dy, int k_out, int k_grad) {
    const Result f = run(make, DType::F32, x, dy), h = run(make, DType::BF16, x, dy);
    const double e_out = rel_l2(h.y, f.y);
    EXPECT_LE(e_out, 2 * k_out * kBf16) << "output";
    EXPECT_GT(e_out, 0.0) << "the bf16 run rounded nothing";
    if (!f.dx.empty()) {
      EXPECT_LE(rel_l2(h.dx, f.dx), 2 * k_grad * kBf16) << "input gradient";
    }
    double worst = 0;
    for (const auto& [name, g] : f.grads) {
      const double e = rel_l2(h.grads.at(name), g);
      worst = std::max(worst, e);
      EXPECT_LE(e, 2 * k_grad * kBf16) << "gradient of " << name;
    }
    std::printf("  bf16 vs f32: output %.2e (bound %.2e), worst gradient %.2e (bound %.2e)\n", e_out,
                2 * k_out * kBf16, worst, 2 * k_grad * kBf16);
  }

  static constexpr int B = 2, T = 16;
  std::unique_ptr<Backend> backend;
  std::shared_ptr<MemoryPool> pool;
  ModelConfig cfg;
  Tensor tokens, targets;
};

TEST_F(LayerInBf16, Embedding) {
  // Output: the weights and the output are rounded (K = 2); gradients: scatters of the
  // same bf16 dy, no rounding in between (K = 1 for the bound's sake).
  compare([&](ParameterStore& s) { return std::make_unique<Embedding>(cfg, s); }, {}, rounded({B * T, cfg.d_model}, 3), 2,
          1);
}

TEST_F(LayerInBf16, Block) {
  // Output: weights, ln1, qkv, attention out, res2, ln2, fc, gelu, y (K = 9). Gradients
  // add the probabilities and dfc, dln2, dres2, dqkv, dln1, dx (K = 16).
  compare([&](ParameterStore& s) { return std::make_unique<Block>(cfg, 0, s); }, rounded({B * T, cfg.d_model}, 4),
          rounded({B * T, cfg.d_model}, 5), 9, 16);
}

TEST_F(LayerInBf16, LossHead) {
  // Losses: weights, lnf (K = 2); gradients: + dlogits, dlnf, dx (K = 5).
  compare([&](ParameterStore& s) { return std::make_unique<LossHead>(cfg, s); }, rounded({B * T, cfg.d_model}, 6), {}, 2,
          5);
}

// Llama's block in bf16 (grouped-query attention, RoPE, SwiGLU, RMSNorm). Output: weights,
// n1, qkv (after RoPE), attention out, h, n2, gate, up, SwiGLU, y (K = 10). Gradients add
// the probabilities and da, dg, du, dn2, dh, dqkv, dn1, dx (K = 19).
TEST_F(LayerInBf16, LlamaBlock) {
  cfg.arch = "llama";
  cfg.n_kv_head = 2;
  cfg.ffn_hidden = 96;
  cfg.rope_theta = 10000;
  compare([&](ParameterStore& s) { return std::make_unique<LlamaBlock>(cfg, 0, s); }, rounded({B * T, cfg.d_model}, 4),
          rounded({B * T, cfg.d_model}, 5), 10, 19);
}

// A mixture-of-experts MLP half (4 experts, top 2, one shared expert, both auxiliary losses).
// Output: weights, n, gate, up, SwiGLU, y along each expert's path (K = 6); gradients add
// the stored expert outputs (the routing weights' gradient), the routed rows' dy, dg, du,
// dn, dx (K = 12). The router's logits move by ~2^-9 relative under the rounded n; no
// token here has its second and third choices that close, so the choices are the same.
TEST_F(LayerInBf16, MixtureOfExpertsMlp) {
  cfg.arch = "llama";
  cfg.n_experts = 4;
  cfg.top_k = 2;
  cfg.expert_ffn_hidden = 32;
  cfg.n_shared_experts = 1;
  cfg.aux_loss_coeff = 0.01;
  cfg.z_loss_coeff = 0.001;
  compare([&](ParameterStore& s) { return std::make_unique<MoeMlp>(cfg, 0, s); }, rounded({B * T, cfg.d_model}, 4),
          rounded({B * T, cfg.d_model}, 5), 6, 12);
}

// Llama's head: RMSNorm and an untied LM head. Losses: weights, norm (K = 2); gradients:
// + dlogits, dnorm, dx (K = 5).
TEST_F(LayerInBf16, LlamaHead) {
  cfg.arch = "llama";
  compare([&](ParameterStore& s) { return std::make_unique<LossHead>(cfg, s); }, rounded({B * T, cfg.d_model}, 6), {}, 2,
          5);
}


using testing::pattern_source;
Config train_config(const std::string& precision) { return testing::mixed_precision_config(precision); }

TEST(MixedPrecisionTraining, HundredStepsTrackFp32) {
  // Each step's loss is a forward through L = 9 n_layer + 4 rounding points (blocks,
  // embedding output and weights, head weights and lnf): bound 2 L 2^-8 relative, per step.
  auto be = make_cpu_backend();
  const Config f = train_config("fp32"), h = train_config("bf16");
  Grid grid(MPI_COMM_SELF, f.parallel);
  Trainer a(f, grid, *be, pattern_source(16)), b(h, grid, *be, pattern_source(16));
  const double bound = 2 * (9 * f.model.n_layer + 4) * kBf16;
  double worst = 0, first = 0, last = 0;
  for (int s = 0; s < f.train.steps; ++s) {
    const double la = a.train_step(s).loss, lb = b.train_step(s).loss;
    worst = std::max(worst, std::abs(lb - la) / la);
    if (s == 0) first = lb;
    last = lb;
    ASSERT_LE(std::abs(lb - la) / la, bound) << "step " << s << ": bf16 " << lb << ", fp32 " << la;
  }
  EXPECT_LT(last, 0.5 * first) << "bf16 training does not learn";
  std::printf("  100 steps: worst relative loss difference %.2e (bound %.2e)\n", worst, bound);
}

TEST(MixedPrecisionTraining, StashedActivationsTakeAboutHalf) {
  // GPipe on one rank keeps all 8 microbatches' stashes at once: the step's peak above
  // what is allocated before it is the stash plus one layer's working tensors. The
  // stored part halves; LayerNorm statistics stay f32 (2 of 16 d_model + n_head T values
  // per token per block), so the ratio lies between 0.5 and 0.6.
  auto be = make_cpu_backend();
  double peak[2];
  for (int i = 0; i < 2; ++i) {
    Config c = train_config(i == 0 ? "fp32" : "bf16");
    c.model.d_model = 64;
    c.model.n_head = 4;
    c.model.n_layer = 4;
    c.schedule.name = "gpipe";
    c.train.steps = 2;
    Grid grid(MPI_COMM_SELF, c.parallel);
    Trainer t(c, grid, *be, pattern_source(16));
    t.train_step(0);
    const size_t before = t.pool().stats().in_use_bytes;
    t.pool().reset_peak();
    t.train_step(1);
    peak[i] = static_cast<double>(t.pool().stats().peak_in_use_bytes - before);
  }
  const double ratio = peak[1] / peak[0];
  std::printf("  activation memory: fp32 %.0f KiB, bf16 %.0f KiB, ratio %.3f\n", peak[0] / 1024, peak[1] / 1024, ratio);
  EXPECT_GE(ratio, 0.45);
  EXPECT_LE(ratio, 0.62);
}

}  // namespace
}  // namespace pipetrain
