// A training step's routing, summed over its microbatches and (once the trainer has
// all-reduced flat()) over every rank: for each mixture-of-experts block, its experts'
// routed rows and the sums of its auxiliary losses. What the step's metrics report: the
// mean load-balancing and z-losses (over the MoE blocks and microbatches, before their
// coefficients) and each MoE block's busiest expert's rows over the mean.
// Exports: MoeStepStats.
#pragma once
#include <vector>

#include "pipetrain/backend/moe_routing.hpp"
#include "pipetrain/core/config.hpp"

namespace pipetrain {

class MoeStepStats {
 public:
  explicit MoeStepStats(const ModelConfig& cfg);
  void add(int block, const RouteCounts& r);  // one microbatch's routing of block `block`
  void clear();
  std::vector<double>& flat() { return sums_; }  // to be summed over the ranks in place

  double load_balance() const;  // mean over the MoE blocks and microbatches
  double z() const;
  std::vector<double> max_over_mean_load() const;  // per MoE block, in block order
  std::vector<double> dropped_fraction() const;    // per MoE block: choices dropped over capacity / all
  const double* loads(int block) const { return row(block); }  // block's routed rows per expert

 private:
  double* row(int block) { return sums_.data() + static_cast<size_t>(block) * width_; }
  const double* row(int block) const { return sums_.data() + static_cast<size_t>(block) * width_; }
  ModelConfig cfg_;
  size_t width_;              // per block: the experts' loads, then dropped, load balance, z, microbatches
  std::vector<double> sums_;  // n_layer rows of width_
};

}  // namespace pipetrain
