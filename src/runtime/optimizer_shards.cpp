#include "pipetrain/runtime/optimizer_shards.hpp"

#include <memory>

#include "pipetrain/runtime/optimizer.hpp"

namespace pipetrain {

OptimizerShards::OptimizerShards(const ParameterStore& params, const GridShape& grid, int replica, int expert_replica,
                                 MemoryPool& pool, Backend& backend) {
  const int64_t experts = params.numel() - params.expert_begin();
  // Shared out over the ranks holding the same parameters: dp x cp (experts: cp = 1).
  const int64_t n = params.expert_begin() / grid.replicas(), e = experts / grid.expert_dp();
  ranges_.push_back({n * replica, n * (replica + 1), 0});
  if (e > 0)
    ranges_.push_back(
        {params.expert_begin() + e * expert_replica, params.expert_begin() + e * (expert_replica + 1), n});
  for (Tensor* t : {&m_, &v_}) {
    *t = Tensor::empty(pool, {n + e});
    backend.fill(t->f32(), 0.0f, static_cast<size_t>(n + e));
  }
}

void OptimizerShards::gather(const ParameterStore& params, const Tensor& src, const Tensor& dst, Communicator& dp,
                             Communicator* expert_dp, Backend& backend) const {
  const int64_t split = params.expert_begin(), n = params.numel();
  std::vector<std::unique_ptr<CommRequest>> parts;
  parts.push_back(
      dp.all_gather(src.view(ranges_[0].lo, {ranges_[0].hi - ranges_[0].lo}), dst.view(0, {split}), backend.stream()));
  if (ranges_.size() > 1)
    parts.push_back(expert_dp->all_gather(src.view(ranges_[1].lo, {ranges_[1].hi - ranges_[1].lo}),
                                          dst.view(split, {n - split}), backend.stream()));
  for (auto& p : parts) p->wait();
}

void OptimizerShards::adamw(ParameterStore& params, Backend& backend, const TrainConfig& t, int step, double lr,
                            float grad_scale, const std::function<bool(const Parameter&)>& updates) {
  for_each(params, [&](const Parameter& p, int64_t lo, int64_t hi, const Range& r) {
    if (!updates(p)) return;
    adamw_elements(backend, t, p, params.values().f32() + lo, params.grads().f32() + lo, m(r, lo), v(r, lo),
                   static_cast<size_t>(hi - lo), step, lr, grad_scale);
  });
}

}  // namespace pipetrain
