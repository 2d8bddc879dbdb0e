// The Trainer's mixture-of-experts work between steps: the step's routing metrics, the
// selection biases' update, and the expert-parallel share of the gradient norm.
#include <vector>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/backend/moe_routing.hpp"
#include "pipetrain/model/moe_mlp.hpp"
#include "pipetrain/model/moe_stats.hpp"
#include "pipetrain/runtime/trainer.hpp"

namespace pipetrain {

// The step's routing over every rank's blocks and microbatches (counted on tp rank 0 only:
// the tp ranks route alike).
void Trainer::expert_metrics(StepMetrics& out) {
  auto& flat = moe_stats_->flat();
  grid_.world().allreduce_sum(flat.data(), flat.size());
  out.moe_load_balance = moe_stats_->load_balance();
  out.moe_z = moe_stats_->z();
  out.moe_max_load = moe_stats_->max_over_mean_load();
  if (cfg_.model.capacity_factor > 0) out.moe_dropped = moe_stats_->dropped_fraction();
}

// DeepSeek-V3's balancing: each MoE block's selection bias on this rank moves by the step's
// loads, summed over every rank: the same on every replica, so their copies stay equal.
void Trainer::update_selection_biases() {
  const int E = cfg_.model.n_experts;
  std::vector<float> bias(static_cast<size_t>(E));
  for (int b = 0; b < cfg_.model.n_layer; ++b) {
    Parameter* p = cfg_.model.moe(b) ? params_.find(MoeMlp::selection_bias_name(b)) : nullptr;
    if (!p) continue;
    backend_.to_host(bias.data(), p->value.raw(), bias.size() * sizeof(float));
    update_selection_bias(bias.data(), moe_stats_->loads(b), E, cfg_.model.router_bias_rate);
    backend_.to_device(p->value.raw(), bias.data(), bias.size() * sizeof(float));
  }
}

}  // namespace pipetrain
