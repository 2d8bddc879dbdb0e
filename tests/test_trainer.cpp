// Single-rank training: the loss falls, microbatch splits do not change the result,
// the first loss is ln(vocab) at GPT-2 init, and the steady state allocates nothing.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>

#include <cstring>
#include <fmt/format.h>

#include "model_fixtures.hpp"
#include "test_files.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/backend/backend.hpp"
#include "pipetrain/plan/cost_model.hpp"
#include "pipetrain/runtime/product_timing.hpp"
#include "pipetrain/runtime/trainer.hpp"
#include "pipetrain/topology/grid.hpp"

namespace pipetrain {
namespace {

Config tiny_config(int microbatches) { return testing::tiny_training_config(microbatches); }

using testing::pattern_source;

TEST(Trainer, LossFallsAndStartsAtLnVocab) {
  auto backend = make_cpu_backend();
  Config cfg = tiny_config(1);
  Grid grid(MPI_COMM_SELF, cfg.parallel);
  Trainer trainer(cfg, grid, *backend, pattern_source(cfg.train.seq_len));
  double first = 0, last = 0;
  for (int s = 0; s < cfg.train.steps; ++s) {
    const StepMetrics m = trainer.train_step(s);
    if (s == 0) first = m.loss;
    last = m.loss;
    EXPECT_TRUE(std::isfinite(m.loss));
    EXPECT_GT(m.grad_norm, 0.0);
  }
  EXPECT_NEAR(first, std::log(50.0), 0.1);
  EXPECT_LT(last, 0.2 * first) << "first " << first << " last " << last;
}

TEST(Trainer, MicrobatchSplitGivesTheSameSteps) {
  auto backend = make_cpu_backend();
  std::vector<std::vector<double>> losses;
  std::vector<std::vector<float>> params;
  for (int mb : {1, 2, 4}) {
    Config cfg = tiny_config(mb);
    Grid grid(MPI_COMM_SELF, cfg.parallel);
  Trainer trainer(cfg, grid, *backend, pattern_source(cfg.train.seq_len));
    losses.emplace_back();
    for (int s = 0; s < 5; ++s) losses.back().push_back(trainer.train_step(s).loss);
    const Tensor& v = trainer.params().values();
    params.emplace_back(v.f32(), v.f32() + v.numel());
  }
  for (size_t k = 1; k < losses.size(); ++k) {
    for (size_t s = 0; s < losses[0].size(); ++s)
      EXPECT_NEAR(losses[k][s], losses[0][s], 1e-5 * losses[0][s]) << "split " << k << " step " << s;
    for (size_t i = 0; i < params[0].size(); ++i)
      ASSERT_NEAR(params[k][i], params[0][i], 1e-5 + 1e-4 * std::abs(params[0][i])) << "param " << i;
  }
}

// runtime.dense_products and runtime.pack_weights = "auto" (the defaults) resolve by
// plan/product_choice's rule from the times of the run's cache file (here written by hand:
// oneDNN twice the BLAS's speed on the forward only; packing saves 0.6 ms a use against 1 ms
// of reorders), and the products then run as chosen: oneDNN's forward at any microbatch
// count; packed at 2 microbatches a step, not at 1, nor for inference, nor where set false;
// and nothing timed below d_model 512.
TEST(Trainer, DenseProductsResolveForTheRunFromItsTimes) {
  auto backend = make_cpu_backend();
  const bool can = backend->set_pack_weights(true) && backend->set_dense_paths(DensePaths{{ProductLibrary::Onednn}, {}});
  backend->set_dense_paths({});
  if (!can) GTEST_SKIP() << "this build or CPU has no oneDNN paths: only the BLAS runs";
  struct Case {
    int d_model, microbatches;
    Toggle set;
    TrainerUse use;
    bool packs, onednn_forward;
    const char* why;
  };
  const Case cases[] = {
      {512, 2, Toggle::Auto, TrainerUse::Train, true, false, "forward oneDNN (2.00x the BLAS's speed)"},  // packed instead
      {512, 1, Toggle::Auto, TrainerUse::Train, false, true, "not packed (no shape's saving pays"},
      {512, 2, Toggle::Auto, TrainerUse::Inference, false, true, "not packed (no updates"},
      {512, 2, Toggle::Off, TrainerUse::Train, false, true, "input gradient BLAS (1.00x oneDNN's speed)"},
      {256, 2, Toggle::Auto, TrainerUse::Train, false, false, "d_model 256 < 512, too small to time"},
  };
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / fmt::format("pt_dense_{}", ::getpid());
  for (const Case& k : cases) {
    Config cfg = tiny_config(k.microbatches);
    cfg.model.n_layer = 1, cfg.model.n_head = 8, cfg.model.d_model = k.d_model;
    cfg.train.global_batch = 2;
    cfg.runtime.pack_weights = k.set;
    cfg.checkpoint.dir = dir.string();
    const int rows = cfg.train.global_batch / k.microbatches * cfg.train.seq_len;
    std::vector<DenseProductTimes> times;
    for (const DenseShapeCount& s : dense_weight_shapes(cfg.model, 1)) {
      DenseProductTimes t;
      t.shape = timed_shape(s.shape);
      t.rows = rows;
      t.blas = {1e-3, 1e-3, 1e-3};
      t.onednn = {0.5e-3, 1e-3, 1e-3};
      t.packed = {0.3e-3, 0.6e-3};
      t.reorder = 1e-3;
      times.push_back(t);
    }
    save_product_times(product_times_cache(cfg), std::min(rows, kTimedRowsMax), times);
    Grid grid(MPI_COMM_SELF, cfg.parallel);
    const long onednn_before = onednn_sgemm_products_run();
    Trainer trainer(cfg, grid, *backend, pattern_source(cfg.train.seq_len), k.use);
    const std::string at = fmt::format("d_model {}, m = {}, {}", k.d_model, k.microbatches,
                                       k.use == TrainerUse::Train ? "train" : "inference");
    const std::string& why = trainer.dense_products().why;
    EXPECT_EQ(trainer.packs_weights(), k.packs) << at << ": " << why;
    EXPECT_NE(why.find(k.why), std::string::npos) << at << ": " << why;
    if (k.use == TrainerUse::Train) {
      const long packed_before = packed_dense_products_run();
      trainer.train_step(0);
      EXPECT_EQ(packed_dense_products_run() > packed_before, k.packs) << at;
    } else {
      trainer.evaluate(pattern_source(cfg.train.seq_len), 0, cfg.train.global_batch);
    }
    EXPECT_EQ(onednn_sgemm_products_run() > onednn_before, k.onednn_forward) << at;
    backend->set_dense_paths({});
  }
  std::filesystem::remove_all(dir);
}

// Weights whose timed slices coincide (GPT-2's 2304-, 3072- and 50304-row weights are all
// timed as 2048 x 768) are timed once and kept once; read back, each weight gets its slice's
// times and its own scale. A cache missing a shape is timed afresh and rewritten.
TEST(ProductTiming, SharedSlicesAreTimedOnceAndReadBack) {
  auto backend = make_cpu_backend();
  ModelConfig model;
  model.n_layer = 2, model.n_head = 12, model.d_model = 768;
  const int rows = 16;
  std::vector<DenseProductTimes> kept;
  for (const DenseShape s : {DenseShape{2048, 768}, DenseShape{768, 768}, DenseShape{768, 3072}}) {
    DenseProductTimes t;
    t.shape = s, t.rows = rows;
    t.blas = {1e-3 * s.in, 2e-3, 3e-3};
    t.onednn = {4e-3, 5e-3, 6e-3};
    kept.push_back(t);
  }
  const std::string cache =
      (std::filesystem::temp_directory_path() / fmt::format("pt_times_{}.json", ::getpid())).string();
  save_product_times(cache, rows, kept);
  std::string source;
  const std::vector<DenseShapeUse> uses = dense_product_times(model, 1, *backend, rows, MPI_COMM_SELF, cache, &source);
  EXPECT_EQ(source, "from " + cache);
  ASSERT_EQ(uses.size(), 5u);  // qkv, proj, fc, fc proj, head
  for (const DenseShapeUse& u : uses) {
    EXPECT_EQ(u.times.shape, timed_shape(u.shape));
    EXPECT_DOUBLE_EQ(u.times.blas[0], 1e-3 * u.shape.in);
    EXPECT_DOUBLE_EQ(u.scale, static_cast<double>(u.shape.out) / u.times.shape.out);
  }
  EXPECT_EQ(uses.back().shape, (DenseShape{model.padded_vocab(), 768}));
  EXPECT_EQ(uses.back().count, 1);
  EXPECT_EQ(uses.front().count, 2);
  kept.pop_back();  // 768 x 3072 no longer kept: all timed again, here
  save_product_times(cache, rows, kept);
  dense_product_times(model, 1, *backend, rows, MPI_COMM_SELF, cache, &source);
  EXPECT_EQ(source.rfind("timed here in ", 0), 0u) << source;
  EXPECT_EQ(dense_product_times(model, 1, *backend, rows, MPI_COMM_SELF, cache, &source).size(), 5u);
  EXPECT_EQ(source, "from " + cache);
  std::filesystem::remove(cache);
}

TEST(Trainer, FirstLossEqualsEvaluationBeforeUpdate) {
  auto backend = make_cpu_backend();
  Config cfg = tiny_config(2);
  BatchSource src = pattern_source(cfg.train.seq_len);
  Grid grid(MPI_COMM_SELF, cfg.parallel);
  Trainer trainer(cfg, grid, *backend, src);
  const double eval = trainer.evaluate(src, 0, cfg.train.global_batch);
  const double loss = trainer.train_step(0).loss;
  EXPECT_NEAR(eval, loss, 1e-6 * loss);
  EXPECT_NE(trainer.evaluate(src, 0, cfg.train.global_batch), eval);  // the update changed the model
}

TEST(Trainer, SteadyStateAllocatesNothing) {
  auto backend = make_cpu_backend();
  Config cfg = tiny_config(2);
  Grid grid(MPI_COMM_SELF, cfg.parallel);
  Trainer trainer(cfg, grid, *backend, pattern_source(cfg.train.seq_len));
  trainer.train_step(0);
  trainer.train_step(1);
  const PoolStats before = trainer.pool().stats();
  for (int s = 2; s < 6; ++s) trainer.train_step(s);
  const PoolStats after = trainer.pool().stats();
  EXPECT_EQ(before.system_allocations, after.system_allocations);
  EXPECT_EQ(before.reserved_bytes, after.reserved_bytes);
  EXPECT_GT(after.peak_in_use_bytes, 0u);
}

// Generation's trainer holds the weights alone: against a training trainer of the same
// model it lacks exactly three buffers of the values' length (gradients and two moments),
// loads a checkpoint's weights bit for bit, evaluates to the same loss, and refuses to
// train or save with one line.
class TrainerFiles : public testing::TempDirTest {};

TEST_F(TrainerFiles, InferenceHoldsTheWeightsAloneAndEvaluatesAlike) {
  auto backend = make_cpu_backend();
  const Config cfg = tiny_config(1);
  Grid grid(MPI_COMM_SELF, cfg.parallel);
  const auto src = pattern_source(cfg.train.seq_len);
  Trainer trained(cfg, grid, *backend, src);
  const size_t train_reserved = trained.pool().stats().reserved_bytes;
  for (int s = 0; s < 3; ++s) trained.train_step(s);
  const std::string ck = path("ck.h5");
  trained.save_checkpoint(ck, 3);

  Trainer inference(cfg, grid, *backend, src, TrainerUse::Inference);
  const size_t values_bytes = (inference.params().values().bytes() + 63) / 64 * 64;  // the pool's 64-byte blocks
  EXPECT_EQ(inference.pool().stats().reserved_bytes + 3 * values_bytes, train_reserved);
  EXPECT_FALSE(inference.params().grads().defined());
  for (const auto& p : inference.params().params()) EXPECT_FALSE(p.m.defined() || p.v.defined()) << p.name;

  inference.load_checkpoint(ck, true);
  const Tensor& a = trained.params().values();
  const Tensor& b = inference.params().values();
  ASSERT_EQ(a.bytes(), b.bytes());
  EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.bytes()), 0);
  EXPECT_EQ(inference.evaluate(src, 0, cfg.train.global_batch), trained.evaluate(src, 0, cfg.train.global_batch));

  testing::expect_one_line_error([&] { inference.train_step(0); }, {"inference"});
  testing::expect_one_line_error([&] { inference.save_checkpoint(path("x.h5"), 0); }, {"inference", "x.h5"});
  testing::expect_one_line_error([&] { inference.load_checkpoint(ck, false); }, {"inference", "ck.h5"});
}

TEST(Trainer, NonFiniteLossStopsWithTheStep) {
  auto backend = make_cpu_backend();
  Config cfg = tiny_config(1);
  Grid grid(MPI_COMM_SELF, cfg.parallel);
  Trainer trainer(cfg, grid, *backend, pattern_source(cfg.train.seq_len));
  auto& wte = *trainer.params().find("wte");
  wte.value.f32()[3] = std::nanf("");
  try {
    trainer.train_step(0);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step 0"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pipetrain
