// VocabSlice (pipetrain/model/vocab_slice.hpp): R slices of the vocabulary, run one after
// another in one process with their statistics exchanged by hand and their softmax
// partials merged as the reduction does (merge_softmax_partials, rank order), give the
// whole embedding's lookup and its gradient, and the whole output layer's losses,
// hidden-state gradient and weight gradient (a naive float64 reference), tied and untied,
// including slices that hold only padding rows (partials of m = -inf).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "model_fixtures.hpp"
#include "pipetrain/backend/backend.hpp"
#include "pipetrain/comm/softmax_partials.hpp"
#include "pipetrain/model/vocab_slice.hpp"

namespace pipetrain {
namespace {

using testing::random_tensor;
using testing::random_tokens;

struct Case {
  int slices;
  bool tied;
};

class VocabSliceTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    backend = make_cpu_backend();
    pool = MemoryPool::create(*backend);
    cfg = testing::tiny_model();
    if (!GetParam().tied) cfg.arch = "llama", cfg.tie_embeddings = false;
    ctx.backend = backend.get();
    ctx.pool = pool.get();
    ctx.B = 2;
    ctx.T = 5;
    ctx.tokens = random_tokens(*pool, N, cfg.vocab_size, 11);
    ctx.targets = random_tokens(*pool, N, cfg.vocab_size, 12);
    ctx.loss_scale = 1.0f / N;
    for (int r = 0; r < GetParam().slices; ++r) {
      stores.push_back(std::make_unique<ParameterStore>());
      slices.push_back(std::make_unique<VocabSlice>(cfg, *stores.back(), TensorParallel{r, GetParam().slices}));
      stores.back()->allocate(*pool, *backend);
      stores.back()->initialize(5, *backend);
      stores.back()->zero_grads(*backend);
    }
  }

  // Row v of the global table `name` (wte or lm_head.w), from the slice that holds it.
  const float* row(const char* name, int v) {
    const int rows = cfg.padded_vocab() / GetParam().slices;
    const Parameter* p = stores[static_cast<size_t>(v / rows)]->find(name);
    return p->value.f32() + static_cast<size_t>(v % rows) * C;
  }
  const float* grad_row(const char* name, int v) {
    const int rows = cfg.padded_vocab() / GetParam().slices;
    const Parameter* p = stores[static_cast<size_t>(v / rows)]->find(name);
    return p->grad.f32() + static_cast<size_t>(v % rows) * C;
  }
  const char* head() const { return GetParam().tied ? "wte" : "lm_head.w"; }

  static constexpr int N = 10, C = 16;
  std::unique_ptr<Backend> backend;
  std::shared_ptr<MemoryPool> pool;
  ModelConfig cfg;
  MicrobatchContext ctx;
  std::vector<std::unique_ptr<ParameterStore>> stores;
  std::vector<std::unique_ptr<VocabSlice>> slices;
};

TEST_P(VocabSliceTest, EmbeddingSlicesSumToTheLookupAndScatterItsGradient) {
  std::vector<float> sum(static_cast<size_t>(N) * C, 0.0f);
  for (auto& s : slices) {
    const Tensor out = Tensor::empty(*pool, {N, C});
    s->embed_forward(ctx, ctx.tokens, out);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += out.f32()[i];
  }
  // Each row comes from exactly one slice (the others add zeros): exact.
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) ASSERT_EQ(sum[static_cast<size_t>(n) * C + c], row("wte", ctx.tokens.i32()[n])[c]);
  const Tensor dout = random_tensor(*pool, {N, C}, 3);
  for (auto& s : slices) s->embed_backward(ctx, ctx.tokens, dout);
  for (int v = 0; v < cfg.padded_vocab(); ++v)
    for (int c = 0; c < C; ++c) {
      double want = 0;
      for (int n = 0; n < N; ++n)
        if (ctx.tokens.i32()[n] == v) want += dout.f32()[static_cast<size_t>(n) * C + c];
      EXPECT_NEAR(grad_row("wte", v)[c], want, 1e-6 * (1 + std::abs(want))) << "row " << v;
    }
}

TEST_P(VocabSliceTest, OutputSlicesGiveTheWholeLossAndGradients) {
  const int R = GetParam().slices, V = cfg.vocab_size;
  const Tensor x = random_tensor(*pool, {N, C}, 4);
  std::vector<VocabOutputStash> kept;
  const Tensor all = Tensor::empty(*pool, {R, 2, N});
  // The softmax partials merged in rank order, as MPI's reduction does.
  const Tensor merged = Tensor::empty(*pool, {N, 2 + 2 * C}), mine = Tensor::empty(*pool, {N, 2 + 2 * C});
  for (int r = 0; r < R; ++r) {
    const Tensor stats = all.view(static_cast<int64_t>(r) * 2 * N, {2, N});
    kept.push_back(slices[static_cast<size_t>(r)]->output_forward(ctx, x, stats, r == 0 ? &merged : &mine));
    if (r > 0) {  // merged = merged (+) mine, merged the earlier operand
      merge_softmax_partials(merged.f32(), mine.f32(), N, C);
      std::copy(mine.f32(), mine.f32() + mine.numel(), merged.f32());
    }
  }
  const Tensor d = Tensor::empty(*pool, {N, C});
  VocabSlice::hidden_grad(ctx, merged, d);
  const std::vector<double> dx(d.f32(), d.f32() + d.numel());
  for (int r = 0; r < R; ++r) {
    const Tensor losses = Tensor::empty(*pool, {N});
    slices[static_cast<size_t>(r)]->output_backward(ctx, kept[static_cast<size_t>(r)], all, R, losses);
    // The reference, in float64: logits over the V real rows, softmax, cross-entropy.
    // Bound: f32 sums of C = 16 products and V = 50 exponentials, relative (C + V) 2^-24
    // = 4e-6 per value; 1e-5 relative.
    for (int n = 0; n < N; ++n) {
      std::vector<double> z(static_cast<size_t>(V));
      double top = -1e300;
      for (int v = 0; v < V; ++v) {
        double s = 0;
        for (int c = 0; c < C; ++c) s += double(x.f32()[n * C + c]) * row(head(), v)[c];
        z[static_cast<size_t>(v)] = s;
        top = std::max(top, s);
      }
      double sum = 0;
      for (double zv : z) sum += std::exp(zv - top);
      const double lse = top + std::log(sum), loss = lse - z[static_cast<size_t>(ctx.targets.i32()[n])];
      EXPECT_NEAR(losses.f32()[n], loss, 1e-5 * (1 + loss)) << "slice " << r << ", token " << n;
    }
  }
  // dX = scale sum_v (p_v - onehot_v) W_v, dW_v = scale sum_n (p_nv - onehot) x_n.
  std::vector<double> want_dx(dx.size(), 0.0), want_dw(static_cast<size_t>(V) * C, 0.0);
  for (int n = 0; n < N; ++n) {
    std::vector<double> z(static_cast<size_t>(V));
    double top = -1e300, sum = 0;
    for (int v = 0; v < V; ++v) {
      double s = 0;
      for (int c = 0; c < C; ++c) s += double(x.f32()[n * C + c]) * row(head(), v)[c];
      z[static_cast<size_t>(v)] = s, top = std::max(top, s);
    }
    for (double zv : z) sum += std::exp(zv - top);
    for (int v = 0; v < V; ++v) {
      const double g = ctx.loss_scale * (std::exp(z[static_cast<size_t>(v)] - top) / sum - (v == ctx.targets.i32()[n]));
      for (int c = 0; c < C; ++c) {
        want_dx[static_cast<size_t>(n) * C + c] += g * row(head(), v)[c];
        want_dw[static_cast<size_t>(v) * C + c] += g * x.f32()[n * C + c];
      }
    }
  }
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_NEAR(dx[i], want_dx[i], 1e-5 * (1e-3 + std::abs(want_dx[i]))) << i;
  for (int v = 0; v < cfg.padded_vocab(); ++v)
    for (int c = 0; c < C; ++c) {
      const double want = v < V ? want_dw[static_cast<size_t>(v) * C + c] : 0.0;
      EXPECT_NEAR(grad_row(head(), v)[c], want, 1e-5 * (1e-3 + std::abs(want))) << "row " << v;
    }
}

INSTANTIATE_TEST_SUITE_P(Slices, VocabSliceTest,
                         ::testing::Values(Case{1, true}, Case{2, true}, Case{4, true}, Case{2, false}, Case{4, false}),
                         [](const auto& info) {
                           return std::to_string(info.param.slices) + (info.param.tied ? "_tied" : "_untied");
                         });

}  // namespace
}  // namespace pipetrain
