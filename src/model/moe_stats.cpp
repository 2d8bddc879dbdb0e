// MoeStepStats (pipetrain/model/moe_stats.hpp).
#include "pipetrain/model/moe_stats.hpp"

#include <algorithm>

namespace pipetrain {

MoeStepStats::MoeStepStats(const ModelConfig& cfg)
    : cfg_(cfg), width_(static_cast<size_t>(cfg.n_experts) + 4), sums_(static_cast<size_t>(cfg.n_layer) * width_) {}

void MoeStepStats::add(int block, const RouteCounts& r) {
  double* s = row(block);
  for (int e = 0; e < r.experts; ++e) s[e] += r.load(e);
  s[r.experts] += r.dropped;
  s[width_ - 3] += r.load_balance;
  s[width_ - 2] += r.z;
  s[width_ - 1] += 1;
}

void MoeStepStats::clear() { std::fill(sums_.begin(), sums_.end(), 0.0); }

namespace {
double mean_of(const std::vector<double>& sums, size_t width, size_t column, int blocks) {
  double total = 0, count = 0;
  for (int b = 0; b < blocks; ++b) {
    total += sums[static_cast<size_t>(b) * width + column];
    count += sums[static_cast<size_t>(b) * width + width - 1];
  }
  return count > 0 ? total / count : 0.0;
}
}  // namespace

double MoeStepStats::load_balance() const { return mean_of(sums_, width_, width_ - 3, cfg_.n_layer); }
double MoeStepStats::z() const { return mean_of(sums_, width_, width_ - 2, cfg_.n_layer); }

std::vector<double> MoeStepStats::max_over_mean_load() const {
  std::vector<double> out;
  for (int b = 0; b < cfg_.n_layer; ++b) {
    if (!cfg_.moe(b)) continue;
    const double* s = row(b);
    double total = 0, most = 0;
    for (int e = 0; e < cfg_.n_experts; ++e) total += s[e], most = std::max(most, s[e]);
    out.push_back(total > 0 ? most / (total / cfg_.n_experts) : 0.0);
  }
  return out;
}

std::vector<double> MoeStepStats::dropped_fraction() const {
  std::vector<double> out;
  for (int b = 0; b < cfg_.n_layer; ++b) {
    if (!cfg_.moe(b)) continue;
    const double* s = row(b);
    double total = 0;
    for (int e = 0; e < cfg_.n_experts; ++e) total += s[e];
    out.push_back(total > 0 ? s[cfg_.n_experts] / total : 0.0);
  }
  return out;
}

}  // namespace pipetrain
