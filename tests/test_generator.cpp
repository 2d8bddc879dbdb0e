// Generation (runtime/generator.hpp, model/kv_cache.hpp): the cached path gives the
// logits of rerunning the whole sequence through the training forward (GPT-2 and Llama,
// grouped-query attention, RoPE positions after the cache), the uncached path's logits
// give the training head's losses, and sampling is greedy, seeded and truncated as asked.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "model_fixtures.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/model/stage.hpp"
#include "pipetrain/runtime/generator.hpp"

namespace pipetrain {
namespace {

struct Model {
  ModelConfig cfg;
  std::unique_ptr<Backend> be = make_cpu_backend();
  std::shared_ptr<MemoryPool> pool = MemoryPool::create(*be);
  ParameterStore store;
  std::unique_ptr<ModelStage> stage;
  explicit Model(ModelConfig c) : cfg(std::move(c)) {
    stage = std::make_unique<ModelStage>(cfg, 0, model_num_units(cfg), store);
    store.allocate(*pool, *be);
    store.initialize(11, *be);
  }
};

ModelConfig gpt2() {
  ModelConfig m = testing::tiny_model();
  m.max_seq_len = 24;
  return m;
}
ModelConfig llama() {
  ModelConfig m = testing::tiny_model();
  m.arch = "llama";
  m.n_head = 4;
  m.n_kv_head = 2;
  m.d_model = 32;
  m.max_seq_len = 24;
  return m;
}

// Logits relative to their size: two orders of the same f32 sums (u = 6e-8) through a
// few layers of tiny width stay far below 1e-4.
void expect_close(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) d += (a[i] - b[i]) * (a[i] - b[i]), n += b[i] * b[i];
  EXPECT_LT(std::sqrt(d / n), 1e-4) << what;
}

TEST(Generator, CachedLogitsMatchRerunningTheWholeSequence) {
  for (const ModelConfig& cfg : {gpt2(), llama()}) {
    SCOPED_TRACE(cfg.arch);
    Model m(cfg);
    Generator cached(m.cfg, *m.stage, *m.be, *m.pool, true, 24), full(m.cfg, *m.stage, *m.be, *m.pool, false, 24);
    const std::vector<int32_t> tokens = {3, 17, 42, 5, 5, 9, 31, 8, 0, 49, 12, 7};
    // A prompt of 5, then one token at a time: the same logits at every position.
    expect_close(cached.feed(std::span(tokens).first(5)), full.feed(std::span(tokens).first(5)), "prompt");
    for (size_t i = 5; i < tokens.size(); ++i)
      expect_close(cached.feed(std::span(tokens).subspan(i, 1)), full.feed(std::span(tokens).subspan(i, 1)),
                   "token " + std::to_string(i));
  }
}

// The uncached path is the training forward with the head's logits instead of its loss:
// the cross-entropy of those logits is the training loss, token by token.
TEST(Generator, LogitsGiveTheTrainingLoss) {
  for (const ModelConfig& cfg : {gpt2(), llama()}) {
    SCOPED_TRACE(cfg.arch);
    Model m(cfg);
    const int T = 10;
    MicrobatchContext ctx;
    ctx.backend = m.be.get();
    ctx.pool = m.pool.get();
    ctx.B = 1;
    ctx.T = T;
    ctx.tokens = testing::random_tokens(*m.pool, T, cfg.vocab_size, 5);
    ctx.targets = testing::random_tokens(*m.pool, T, cfg.vocab_size, 6);
    Tensor x;
    for (auto& layer : m.stage->layers()) {
      std::unique_ptr<Stash> s;
      x = layer->forward(ctx, x, s);
    }
    Generator gen(m.cfg, *m.stage, *m.be, *m.pool, true, 24);
    for (int t = 0; t < T; ++t) {
      const std::vector<float> logits = gen.feed(std::span<const int32_t>(ctx.tokens.i32() + t, 1));
      const double top = *std::max_element(logits.begin(), logits.end());
      double sum = 0;
      for (float l : logits) sum += std::exp(l - top);
      const double loss = std::log(sum) + top - logits[static_cast<size_t>(ctx.targets.i32()[t])];
      EXPECT_NEAR(loss, x.f32()[t], 1e-4 * std::max(1.0, loss)) << "token " << t;
    }
  }
}

TEST(Generator, StopsAtTheContextByGoingOnFromItsLastHalf) {
  Model m(gpt2());
  Generator cached(m.cfg, *m.stage, *m.be, *m.pool, true, 8), full(m.cfg, *m.stage, *m.be, *m.pool, false, 8);
  SamplingOptions greedy;
  greedy.greedy = true;
  const std::vector<int32_t> prompt = {1, 2, 3};
  const auto a = cached.generate(prompt, 20, greedy), b = full.generate(prompt, 20, greedy);
  EXPECT_EQ(a.size(), 20u);
  EXPECT_EQ(a, b);
  // A prompt longer than the context keeps its end.
  std::vector<int32_t> long_prompt(30);
  std::iota(long_prompt.begin(), long_prompt.end(), 0);
  EXPECT_EQ(cached.generate(long_prompt, 3, greedy), full.generate(long_prompt, 3, greedy));
}

TEST(Sampling, GreedySeededTopKAndTopP) {
  const std::vector<float> logits = {0.5f, 2.0f, 2.0f, -1.0f, 1.0f};
  Rng rng(1);
  SamplingOptions o;
  o.greedy = true;
  EXPECT_EQ(sample_token(logits, o, rng), 1);  // the lowest id among the largest
  o.greedy = false;
  o.top_k = 1;
  for (int i = 0; i < 20; ++i) EXPECT_EQ(sample_token(logits, o, rng), 1);
  o.top_k = 0;
  o.top_p = 0.05;  // the most likely token alone reaches it
  for (int i = 0; i < 20; ++i) EXPECT_EQ(sample_token(logits, o, rng), 1);
  // Temperature 1 over {0, ln 3}: probabilities 1/4 and 3/4; 20000 draws within 4 sigma.
  const std::vector<float> two = {0.0f, static_cast<float>(std::log(3.0))};
  SamplingOptions t;
  Rng r(7);
  int ones = 0;
  for (int i = 0; i < 20000; ++i) ones += sample_token(two, t, r);
  EXPECT_NEAR(ones / 20000.0, 0.75, 4 * std::sqrt(0.75 * 0.25 / 20000));
  // The same seed, the same draws.
  Rng a(42), b(42);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(sample_token(logits, t, a), sample_token(logits, t, b));
  t.temperature = 0;
  EXPECT_THROW(sample_token(logits, t, a), Error);
}

}  // namespace
}  // namespace pipetrain
