// Learning-rate schedules, clipping, weight-decay selection and one AdamW update.
#include <gtest/gtest.h>

#include <cmath>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/runtime/optimizer.hpp"

namespace pipetrain {
namespace {

TEST(Optimizer, WarmupThenCosineToMinLr) {
  TrainConfig c;
  c.lr = 1.0;
  c.min_lr = 0.1;
  c.warmup_steps = 4;
  c.steps = 14;
  c.lr_schedule = "cosine";
  EXPECT_DOUBLE_EQ(learning_rate(c, 0), 0.25);
  EXPECT_DOUBLE_EQ(learning_rate(c, 3), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(c, 4), 1.0);
  EXPECT_NEAR(learning_rate(c, 9), 0.55, 1e-12);  // halfway: (1 + 0.1) / 2
  EXPECT_NEAR(learning_rate(c, 14), 0.1, 1e-12);
  c.lr_schedule = "constant";
  EXPECT_DOUBLE_EQ(learning_rate(c, 9), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(c, 1), 0.5);
}

TEST(Optimizer, ClipScale) {
  EXPECT_FLOAT_EQ(clip_scale(2.0, 1.0), 0.5f);
  EXPECT_FLOAT_EQ(clip_scale(0.5, 1.0), 1.0f);
  EXPECT_FLOAT_EQ(clip_scale(100.0, 0.0), 1.0f);  // off
}

TEST(Optimizer, DecayOnlyMatricesWhenAsked) {
  TrainConfig c;
  Parameter matrix, vector;
  matrix.shape = {4, 4};
  vector.shape = {4};
  c.decay_2d_only = true;
  EXPECT_TRUE(decays(c, matrix));
  EXPECT_FALSE(decays(c, vector));
  c.decay_2d_only = false;
  EXPECT_TRUE(decays(c, vector));
}

TEST(Optimizer, AdamWStepMatchesHandComputation) {
  auto backend = make_cpu_backend();
  auto pool = MemoryPool::create(*backend);
  ParameterStore store;
  store.declare("w", {2, 2}, Init::Zeros);
  store.declare("b", {2}, Init::Zeros);
  store.allocate(*pool, *backend);
  for (auto& p : store.params())
    for (int64_t i = 0; i < p.numel(); ++i) {
      p.value.f32()[i] = 1.0f;
      p.grad.f32()[i] = 0.5f;
    }
  TrainConfig c;
  c.beta1 = 0.9;
  c.beta2 = 0.99;
  c.eps = 1e-8;
  c.weight_decay = 0.1;
  c.decay_2d_only = true;
  AdamW opt(c);
  opt.step(store, *backend, 1, 0.01, 0.5f);  // grads scaled to 0.25
  // step 1: mhat = g, vhat = g^2 -> update = g/|g| = 1
  EXPECT_NEAR(store.find("w")->value.f32()[0], 1.0 - 0.01 * (1.0 + 0.1 * 1.0), 1e-6);
  EXPECT_NEAR(store.find("b")->value.f32()[0], 1.0 - 0.01 * 1.0, 1e-6);
}

// A parameter another rank updates (the first stage's copy of a tied table) gets values
// and gradients but no moments; the others' moments are laid out without it, zeroed, and
// an update of it is refused rather than written through a missing buffer.
TEST(Optimizer, ACopyUpdatedElsewhereHasNoMoments) {
  auto backend = make_cpu_backend();
  auto pool = MemoryPool::create(*backend);
  ParameterStore store;
  store.declare("a", {3}, Init::Zeros);
  store.declare("table", {40, 2}, Init::Zeros).updated = false;
  store.declare("b", {5}, Init::Zeros);
  store.allocate(*pool, *backend);
  Parameter& table = *store.find("table");
  EXPECT_TRUE(table.value.defined() && table.grad.defined());
  EXPECT_FALSE(table.m.defined() || table.v.defined());
  EXPECT_EQ(store.not_updated(), 80);
  const Parameter& a = *store.find("a");
  const Parameter& b = *store.find("b");
  EXPECT_EQ(b.m.f32(), a.m.f32() + 16);  // the table takes no room between them
  EXPECT_EQ(b.v.f32(), a.v.f32() + 16);
  for (const Parameter* p : {&a, &b})
    for (int64_t i = 0; i < p->numel(); ++i) EXPECT_EQ(p->m.f32()[i] + p->v.f32()[i], 0.0f);
  TrainConfig c;
  AdamW opt(c);
  EXPECT_THROW(opt.update(table, *backend, 1, 0.01, 1.0f), Error);
  for (auto& p : store.params())
    for (int64_t i = 0; i < p.numel(); ++i) p.value.f32()[i] = 1.0f, p.grad.f32()[i] = 0.5f;
  opt.step(store, *backend, 1, 0.01, 1.0f, &table);
  EXPECT_EQ(table.value.f32()[0], 1.0f);
  EXPECT_LT(b.value.f32()[4], 1.0f);
}

}  // namespace
}  // namespace pipetrain
