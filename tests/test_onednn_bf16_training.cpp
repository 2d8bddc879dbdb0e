// bf16 training by oneDNN's products against widened sgemm, in a file of its own: where
// oneDNN is not built in or cannot run bf16 every case skips, and CTest reports the entry
// skipped rather than passed.
#include <gtest/gtest.h>

#include <string>

#include "model_fixtures.hpp"
#include "pipetrain/backend/backend.hpp"
#include "pipetrain/backend/bf16_products.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/model/layer.hpp"
#include "pipetrain/model/precision.hpp"
#include "pipetrain/runtime/trainer.hpp"
#include "pipetrain/topology/grid.hpp"
#include "run_compare.hpp"

namespace pipetrain {
namespace {

TEST(OnednnBf16Training, OnednnAndWidenedProductsTrainAlike) {
  // The two CPU paths of a bf16 product (bf16_products.hpp) form the same exact products
  // and differ in f32 summation order, as two grids of one run do; but oneDNN's attention
  // forward multiplies q, k and v rounded to bf16 where the widened path reads them in f32:
  // other rounding points. The losses, step-0 gradients and final parameters agree within
  // the grid suite's bound for those (run_compare.hpp: bf16_other_points_bound).
  if (!onednn_bf16_usable()) GTEST_SKIP() << "oneDNN is not built in or cannot run bf16 here";
  auto widened = make_cpu_backend(Bf16Products::kSgemm), onednn = make_cpu_backend(Bf16Products::kOnednn);
  Config c = testing::mixed_precision_config("bf16");
  c.train.steps = 5;
  const long before = onednn_products_run();
  const testing::RunResult a = testing::run(c, MPI_COMM_SELF, *widened);
  const long products = onednn_products_run() - before;
  const testing::RunResult b = testing::run(c, MPI_COMM_SELF, *onednn);
  EXPECT_EQ(products, 0) << "the widened backend ran oneDNN products";
  EXPECT_GT(onednn_products_run(), before) << "the oneDNN backend ran no product";
  testing::expect_same_run(b, a, c, testing::Bf16Rounding::OtherPoints);
}

// Where a backend multiplies bf16 itself, no matrix keeps a widened (f32) copy of its bf16
// values (products and the embedding's lookup read the bf16 copy): only the vectors (norms,
// biases) do, and a kernel asking for a missing one gets an Error naming the parameter. Where
// products widen, every parameter keeps one. (Both train alike: OnednnAndWidenedProductsTrainAlike.)
TEST(OnednnBf16Training, WidenedCopiesOnlyWhereKernelsReadThem) {
  if (!onednn_bf16_usable()) GTEST_SKIP() << "oneDNN is not built in or cannot run bf16 here";
  auto widened = make_cpu_backend(Bf16Products::kSgemm), onednn = make_cpu_backend(Bf16Products::kOnednn);
  for (const std::string arch : {"gpt2", "llama"}) {
    SCOPED_TRACE(arch);
    Config c = testing::mixed_precision_config("bf16");
    c.model.arch = arch;
    Grid grid(MPI_COMM_SELF, c.parallel);
    Trainer w(c, grid, *widened, testing::pattern_source(16)), n(c, grid, *onednn, testing::pattern_source(16));
    EXPECT_EQ(w.params().widened_numel(), w.params().numel());
    int64_t expect = 0;
    for (const auto& p : n.params().params()) {
      const bool kept = p.shape.size() == 1;
      EXPECT_EQ(p.compute.defined(), kept) << p.name;
      ASSERT_TRUE(p.compute_bf16.defined()) << p.name;
      if (kept) {
        expect += (p.numel() + 15) / 16 * 16;
        for (int64_t i = 0; i < p.numel(); i += 7)  // the widened copy holds the bf16 values
          ASSERT_EQ(p.compute.f32()[i], to_float(p.compute_bf16.bf16_data()[i])) << p.name << " " << i;
      } else {
        try {
          layer_util::compute_weight(p);
          ADD_FAILURE() << p.name << ": no error";
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find(p.name), std::string::npos) << e.what();
        }
      }
    }
    EXPECT_EQ(n.params().widened_numel(), expect);
    EXPECT_LT(n.params().widened_numel(), n.params().numel() / 10);
    n.train_step(0);  // every kernel found the copy it reads
    for (const auto& p : n.params().params())  // refreshed after the update
      for (int64_t i = 0; i < p.numel(); i += 5) {
        ASSERT_EQ(p.compute_bf16.bf16_data()[i].bits, to_bf16(p.value.f32()[i]).bits) << p.name << " " << i;
        if (p.compute.defined()) {
          ASSERT_EQ(p.compute.f32()[i], to_float(p.compute_bf16.bf16_data()[i])) << p.name;
        }
      }
  }
}

}  // namespace
}  // namespace pipetrain
