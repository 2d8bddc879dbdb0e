#include "pipetrain/runtime/optimizer.hpp"

#include <cmath>
#include <numbers>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/core/error.hpp"

namespace pipetrain {

double learning_rate(const TrainConfig& cfg, int step) {
  if (cfg.warmup_steps > 0 && step < cfg.warmup_steps)
    return cfg.lr * (step + 1) / cfg.warmup_steps;
  if (cfg.lr_schedule == "constant") return cfg.lr;
  const int decay_steps = cfg.steps - cfg.warmup_steps;
  if (decay_steps <= 0) return cfg.lr;
  const double progress = std::min(1.0, static_cast<double>(step - cfg.warmup_steps) / decay_steps);
  const double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return cfg.min_lr + coeff * (cfg.lr - cfg.min_lr);
}

float clip_scale(double norm, double max_norm) {
  if (max_norm <= 0.0 || !(norm > max_norm)) return 1.0f;
  return static_cast<float>(max_norm / norm);
}

bool decays(const TrainConfig& cfg, const Parameter& p) {
  return !cfg.decay_2d_only || p.shape.size() >= 2;
}

void adamw_elements(Backend& backend, const TrainConfig& cfg, const Parameter& p, float* value, const float* grad,
                    float* m, float* v, size_t n, int step_count, double lr, float grad_scale) {
  const float wd = decays(cfg, p) ? static_cast<float>(cfg.weight_decay) : 0.0f;
  backend.adamw(value, grad, m, v, n, static_cast<float>(lr), static_cast<float>(cfg.beta1),
                static_cast<float>(cfg.beta2), static_cast<float>(cfg.eps), wd, step_count, grad_scale);
}

void AdamW::update(Parameter& p, Backend& backend, int step_count, double lr, float grad_scale) {
  if (!p.m.defined()) fail("AdamW: parameter {} has no moments on this rank (another rank updates it)", p.name);
  adamw_elements(backend, cfg_, p, p.value.f32(), p.grad.f32(), p.m.f32(), p.v.f32(), static_cast<size_t>(p.numel()),
                 step_count, lr, grad_scale);
}

void AdamW::step(ParameterStore& params, Backend& backend, int step_count, double lr, float grad_scale,
                 const Parameter* skip) {
  for (auto& p : params.params())
    if (&p != skip && p.trained) update(p, backend, step_count, lr, grad_scale);
}

}  // namespace pipetrain
