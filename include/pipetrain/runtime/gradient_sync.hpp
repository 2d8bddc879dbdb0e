// The Trainer's gradient synchronisation: how a rank's gradients become the step's update.
// Summed over the replicas holding the same parameters (dp x cp: DataParallelReducer, its
// buckets overlapping the backward) and over the two copies of a tied embedding on two ranks
// (TiedGradientExchange); then AdamW — every parameter on every replica, or, under ZeRO-1
// (OptimizerShards), each rank its ranges, their new values gathered after. A new mode of
// synchronisation (sharded gradients, sharded weights) is one more case of this class.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/core/config.hpp"
#include "pipetrain/core/memory_pool.hpp"
#include "pipetrain/model/parameters.hpp"
#include "pipetrain/model/stage.hpp"
#include "pipetrain/runtime/dp_reducer.hpp"
#include "pipetrain/runtime/executor.hpp"
#include "pipetrain/runtime/optimizer.hpp"
#include "pipetrain/runtime/optimizer_shards.hpp"
#include "pipetrain/runtime/tied_gradients.hpp"
#include "pipetrain/topology/device_comms.hpp"
#include "pipetrain/topology/grid.hpp"

namespace pipetrain {

class ProgressThread;
class VocabSlice;

class GradientSync {
 public:
  struct Parts {
    ParameterStore& params;
    Backend& backend;
    MemoryPool& pool;
    DeviceComms& comms;
    Grid& grid;
    const Config& cfg;
    // MPI's progress for the reducer's buckets (may give null), started only where there are buckets.
    std::function<ProgressThread*()> progress;
    VocabSlice* vocab_slice;  // its parameters are reduced last (vocabulary parallelism)
  };
  // `mine`: this rank's stages; `zero1`: parallel.zero1 over more than one replica.
  GradientSync(const Parts& parts, const std::map<int, ModelStage*>& mine, bool zero1);

  // Before the step's program: the tied pair's previous sum is out, the gradients zeroed,
  // and the hooks that start each layer's reductions as its gradients become final.
  void begin_step(ExecutorHooks& hooks);
  // After the program: every reduction this rank started is complete (the tied table's sum
  // may still arrive on the last stage, for its update).
  void reduce();
  // Whether this rank's copy of `p` enters the gradient norm: each value once over the
  // grid (a tied table on two ranks: the first stage's copy; a replicated tensor-parallel
  // parameter: tp rank 0's).
  bool counts_in_norm(const Parameter& p) const;
  // Whether this rank writes `p`'s optimizer moments to checkpoints: the rank that updates
  // it (a tied table on two ranks: the last stage's copy), each value once.
  bool writes_moments(const Parameter& p) const;
  // This rank's sum of squared gradients over the parameters that count in the norm, the
  // expert-parallel ones left out (local_expert_squares); under ZeRO-1, of its ranges only.
  double local_squares();
  double local_expert_squares();
  // AdamW (`step` 0-based) and the values' way back: the tied table to the first stage,
  // ZeRO-1's ranges to every replica; then the bf16 compute copies.
  void update(AdamW& optimizer, int step, double lr, float grad_scale);
  // The step's fully reduced gradient as one flat host buffer (gathered under ZeRO-1).
  std::vector<float> reduced_gradients();

  bool sharded() const { return shards_ != nullptr; }
  OptimizerShards* shards() { return shards_.get(); }
  const DataParallelReducer* reducer() const { return reducer_.get(); }
  const TiedGradientExchange* tied() const { return tied_.get(); }

 private:
  Parts parts_;
  std::unique_ptr<DataParallelReducer> reducer_;  // dp x cp > 1
  std::unique_ptr<TiedGradientExchange> tied_;    // first and last stage on different ranks, tied head
  std::unique_ptr<OptimizerShards> shards_;       // ZeRO-1
  void gather(const Tensor& src, const Tensor& dst);
  // A tensor-parallel shard, or a replicated parameter on tp rank 0: each value once over tp.
  bool once_over_tp(const Parameter& p) const;
};

}  // namespace pipetrain
