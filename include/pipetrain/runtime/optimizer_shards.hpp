// ZeRO-1's share of one rank (parallel.zero1): the ranges [lo, hi) of the flat parameter
// buffers it owns — its share over the ranks holding the same parameters (dp x cp) of the
// part every ep rank holds alike and, under parallel.ep, its expert-dp share of the
// expert-parallel part (ParameterStore::expert_begin) — and the AdamW moments of those
// ranges. The dp reducer sums their gradients there in place; the rank updates them, then
// every rank's new values are gathered. The Trainer's gradient synchronisation holds one
// where ZeRO-1 is on.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/comm/communicator.hpp"
#include "pipetrain/core/config.hpp"
#include "pipetrain/core/memory_pool.hpp"
#include "pipetrain/core/tensor.hpp"
#include "pipetrain/model/parameters.hpp"

namespace pipetrain {

class OptimizerShards {
 public:
  struct Range {
    int64_t lo, hi, at;  // [lo, hi) of the flat buffers; its moments start at `at`
  };
  // `replica` this rank's place among the replicas (rank of the dp x cp group), `expert_replica`
  // among the ranks holding the same experts (dp / ep); the moments start at zero.
  OptimizerShards(const ParameterStore& params, const GridShape& grid, int replica, int expert_replica,
                  MemoryPool& pool, Backend& backend);

  const std::vector<Range>& ranges() const { return ranges_; }
  int64_t shard_elems() const { return ranges_[0].hi - ranges_[0].lo; }
  int64_t expert_shard_elems() const { return ranges_.size() > 1 ? ranges_[1].hi - ranges_[1].lo : 0; }
  float* m(const Range& r, int64_t lo) { return m_.f32() + r.at + (lo - r.lo); }
  float* v(const Range& r, int64_t lo) { return v_.f32() + r.at + (lo - r.lo); }

  // f(param, lo, hi, range) for the part [lo, hi) of each parameter in each range.
  template <typename Params, typename F>
  void for_each(Params& params, F&& f) const {
    for (const Range& r : ranges_)
      for (auto& p : params.params()) {
        const int64_t lo = std::max(p.offset, r.lo), hi = std::min(p.offset + p.numel(), r.hi);
        if (lo < hi) f(p, lo, hi, r);
      }
  }
  // src's ranges into every rank's dst (each part gathered over the ranks holding it: `dp`
  // for the first, `expert_dp` for the experts').
  void gather(const ParameterStore& params, const Tensor& src, const Tensor& dst, Communicator& dp,
              Communicator* expert_dp, Backend& backend) const;
  // AdamW (step `step`, 1-based) on this rank's ranges of the parameters `updates` accepts.
  void adamw(ParameterStore& params, Backend& backend, const TrainConfig& t, int step, double lr, float grad_scale,
             const std::function<bool(const Parameter&)>& updates);

 private:
  std::vector<Range> ranges_;
  Tensor m_, v_;
};

}  // namespace pipetrain
