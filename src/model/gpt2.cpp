#include "pipetrain/model/gpt2.hpp"

#include "pipetrain/core/error.hpp"
#include "pipetrain/model/gpt2_layers.hpp"

namespace pipetrain {

int gpt2_num_units(const ModelConfig& cfg) { return cfg.n_layer + 2; }

Gpt2Stage::Gpt2Stage(const ModelConfig& cfg, int first_unit, int last_unit, ParameterStore& params)
    : first_(first_unit), last_(last_unit), num_units_(gpt2_num_units(cfg)), params_(params) {
  if (cfg.arch != "gpt2") fail("model.arch: unsupported architecture \"{}\"", cfg.arch);
  if (first_ < 0 || last_ > num_units_ || first_ >= last_)
    fail("stage units [{}, {}) outside the model's {} units", first_, last_, num_units_);
  for (int u = first_; u < last_; ++u) {
    if (u == 0)
      layers_.push_back(std::make_unique<Embedding>(cfg, params_));
    else if (u == num_units_ - 1)
      layers_.push_back(std::make_unique<LossHead>(cfg, params_));
    else
      layers_.push_back(std::make_unique<Block>(cfg, u - 1, params_));
  }
}

double gpt2_flops_per_token(const ModelConfig& cfg, int64_t num_params, int seq_len) {
  return 6.0 * static_cast<double>(num_params) +
         6.0 * cfg.n_layer * static_cast<double>(cfg.d_model) * seq_len;
}

}  // namespace pipetrain
