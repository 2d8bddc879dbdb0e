// Learning-rate schedules, global-norm gradient clipping and the AdamW update
// over a stage's ParameterStore.
#pragma once
#include "pipetrain/core/config.hpp"
#include "pipetrain/model/parameters.hpp"

namespace pipetrain {

class Backend;

// Learning rate for 0-based `step`: linear warmup over warmup_steps to train.lr, then
// constant, or cosine decay from train.lr to train.min_lr at train.steps.
double learning_rate(const TrainConfig& cfg, int step);

// Multiplier that clips a gradient of global norm `norm` to `max_norm` (0 = off).
float clip_scale(double norm, double max_norm);

// Whether a parameter gets weight decay (all, or only matrices with decay_2d_only).
bool decays(const TrainConfig& cfg, const Parameter& p);

// AdamW on n elements of parameter p (its weight decay from `cfg`), wherever they live:
// the whole tensor, or a rank's part of it (ZeRO-1's ranges, the unit shards).
void adamw_elements(Backend& backend, const TrainConfig& cfg, const Parameter& p, float* value, const float* grad,
                    float* m, float* v, size_t n, int step_count, double lr, float grad_scale);

class AdamW {
 public:
  explicit AdamW(const TrainConfig& cfg) : cfg_(cfg) {}
  // One update of every parameter but `skip` (step_count is 1-based for bias correction);
  // grads are multiplied by grad_scale first (the clipping factor).
  void step(ParameterStore& params, Backend& backend, int step_count, double lr, float grad_scale,
            const Parameter* skip = nullptr);
  // The same update of one parameter.
  void update(Parameter& p, Backend& backend, int step_count, double lr, float grad_scale);

 private:
  TrainConfig cfg_;
};

}  // namespace pipetrain
