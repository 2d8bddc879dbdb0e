// runtime.pack_weights and runtime.dense_products on one rank, in a file of their own: on a
// build or CPU that cannot pack weights or has no oneDNN every case skips, and CTest reports
// the entry skipped rather than passed.
#include <gtest/gtest.h>

#include <vector>

#include "model_fixtures.hpp"
#include "run_compare.hpp"
#include "pipetrain/backend/backend.hpp"
#include "pipetrain/plan/cost_model.hpp"
#include "pipetrain/plan/product_choice.hpp"
#include "pipetrain/runtime/trainer.hpp"
#include "pipetrain/topology/grid.hpp"

namespace pipetrain {
namespace {

// runtime.pack_weights: the forward and input-gradient products by weights kept in
// oneDNN's layout train the same steps as sgemm, within the bounds of test_trainer.cpp's microbatch-split test
// (both change only the order of the products' sums), and every such product of a step
// ran by the packed copy: forward and dx of each block's four dense layers and the head.
TEST(PackedWeightTraining, GivesTheSameSteps) {
  auto backend = make_cpu_backend();
  if (!backend->set_pack_weights(true)) GTEST_SKIP() << "this build or CPU cannot pack weights";
  constexpr int kSteps = 5;
  std::vector<std::vector<double>> losses;
  std::vector<std::vector<float>> params;
  for (bool pack : {false, true}) {
    Config cfg = testing::tiny_training_config(2);
    cfg.runtime.pack_weights = pack ? Toggle::On : Toggle::Off;
    Grid grid(MPI_COMM_SELF, cfg.parallel);
    Trainer trainer(cfg, grid, *backend, testing::pattern_source(cfg.train.seq_len));
    const long before = packed_dense_products_run();
    losses.emplace_back();
    for (int s = 0; s < kSteps; ++s) losses.back().push_back(trainer.train_step(s).loss);
    const long per_step = cfg.train.microbatches * 2 * (4 * cfg.model.n_layer + 1);
    EXPECT_EQ(packed_dense_products_run() - before, pack ? kSteps * per_step : 0) << "pack " << pack;
    const Tensor& v = trainer.params().values();
    params.emplace_back(v.f32(), v.f32() + v.numel());
  }
  for (size_t s = 0; s < losses[0].size(); ++s)
    EXPECT_NEAR(losses[1][s], losses[0][s], 1e-5 * losses[0][s]) << "step " << s;
  for (size_t i = 0; i < params[0].size(); ++i)
    ASSERT_NEAR(params[1][i], params[0][i], 1e-5 + 1e-4 * std::abs(params[0][i])) << "param " << i;
}

// The memory estimate (header and planner) counts runtime.pack_weights' copies as two per
// matrix the dense products multiply by (dense_weight_params), none under native bf16
// products: the copies the backend holds after a step must be exactly those.
TEST(PackedWeightTraining, CopiesAreWhatTheMemoryEstimateCounts) {
  auto backend = make_cpu_backend();
  if (!backend->set_pack_weights(true)) GTEST_SKIP() << "this build or CPU cannot pack weights";
  for (const char* precision : {"fp32", "bf16"}) {
    Config cfg = testing::tiny_training_config(2);
    cfg.model.n_layer = 3;
    cfg.train.precision = precision;
    cfg.runtime.pack_weights = Toggle::On;
    Grid grid(MPI_COMM_SELF, cfg.parallel);
    Trainer trainer(cfg, grid, *backend, testing::pattern_source(cfg.train.seq_len));
    trainer.train_step(0);
    double dense = 0;
    for (const StageUnits& u : trainer.stage_units())
      for (const StagePiece& p : stage_pieces(cfg.model, u)) dense += dense_weight_params(cfg.model, p.kind, 1);
    const bool f32_products = cfg.train.precision == "fp32" || !backend->bf16_products_native();
    const Backend::PackedWeights held = backend->packed_weights();
    EXPECT_EQ(static_cast<double>(held.elements), f32_products ? 2 * dense : 0.0) << precision;
    EXPECT_GE(held.bytes, 4 * static_cast<size_t>(held.elements)) << precision;  // padding only adds
  }
}

// Every path the start-up choice can pick (plan/product_choice.hpp: a library per product,
// packed or not) trains the single-rank reference (all three in the BLAS) within the grid
// suite's fp32 bounds: they change only the order of the products' sums. A seeded mistake in
// one path (oneDNN's weight gradient with beta 0, dropping what the earlier microbatch
// accumulated) fails the comparison.
TEST(DenseProductPaths, EachPathTheChoiceCanPickTrainsAsTheReference) {
  auto backend = make_cpu_backend();
  if (!backend->set_dense_paths(DensePaths{{ProductLibrary::Onednn, ProductLibrary::Onednn, ProductLibrary::Onednn},
                                           {DenseShape{64, 64}}}))
    GTEST_SKIP() << "this build or CPU has no oneDNN paths (sgemm and packed weights): only the BLAS runs";
  backend->set_dense_paths({});
  Config cfg = testing::tiny_training_config(2);
  cfg.train.steps = 4;
  cfg.runtime.pack_weights = Toggle::Off;
  cfg.runtime.dense_products = "blas";
  const testing::RunResult ref = testing::run(cfg, MPI_COMM_SELF, *backend);
  std::vector<DenseShape> every_shape;
  for (const DenseShapeCount& s : dense_weight_shapes(cfg.model, 1)) every_shape.push_back(s.shape);
  for (int mask = 1; mask < 16; ++mask) {  // bits 0-2: that product in oneDNN; bit 3: packed
    DensePaths p;
    for (int k = 0; k < 3; ++k) p.library[k] = (mask >> k) & 1 ? ProductLibrary::Onednn : ProductLibrary::Blas;
    if (mask & 8) p.packed = every_shape;
    SCOPED_TRACE(::testing::Message() << "forward " << library_name(p.library[0]) << ", input gradient "
                                      << library_name(p.library[1]) << ", weight gradient "
                                      << library_name(p.library[2]) << (p.packed.empty() ? "" : ", packed"));
    const long onednn_before = onednn_sgemm_products_run(), packed_before = packed_dense_products_run();
    testing::expect_same_run(testing::run(cfg, MPI_COMM_SELF, *backend, {}, &p), ref, cfg);
    const bool plain_onednn = p.library[2] == ProductLibrary::Onednn ||
                              (p.packed.empty() && (p.library[0] == ProductLibrary::Onednn ||
                                                    p.library[1] == ProductLibrary::Onednn));
    EXPECT_EQ(onednn_sgemm_products_run() > onednn_before, plain_onednn);
    EXPECT_EQ(packed_dense_products_run() > packed_before, !p.packed.empty());
    backend->set_dense_paths({});
  }
}

}  // namespace
}  // namespace pipetrain
