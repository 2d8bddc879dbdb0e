// The Trainer's gradient synchronisation: how a rank's gradients become the step's update.
// Summed over the replicas holding the same parameters (dp x cp: DataParallelReducer, its
// buckets overlapping the backward) and over the two copies of a tied embedding on two ranks
// (TiedGradientExchange); then AdamW — every parameter on every replica, or, under ZeRO-1
// (OptimizerShards), each rank its ranges, their new values gathered after. Under sharded
// gradients or weights (parallel.shard; UnitShards) the program's own instructions reduce
// each unit into this rank's part, and the rank updates its parts: a tied table on two ranks
// is laid out alike on both, so its parts' sum is one all-reduce over the pair, and both
// copies then take the same update.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/comm/mpi_communicator.hpp"
#include "pipetrain/core/config.hpp"
#include "pipetrain/core/memory_pool.hpp"
#include "pipetrain/model/parameters.hpp"
#include "pipetrain/model/stage.hpp"
#include "pipetrain/runtime/dp_reducer.hpp"
#include "pipetrain/runtime/executor.hpp"
#include "pipetrain/runtime/optimizer.hpp"
#include "pipetrain/runtime/optimizer_shards.hpp"
#include "pipetrain/runtime/tied_gradients.hpp"
#include "pipetrain/runtime/unit_shards.hpp"
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
  // `mine`: this rank's stages; `level`: parallel.shard over more than one replica;
  // `units`: the rank's units (runtime/shard_units.hpp), for "gradients" and "weights".
  GradientSync(const Parts& parts, const std::map<int, ModelStage*>& mine, ShardLevel level, RankUnits units = {});
  // "weights": the initial values, into this rank's parts (ParameterStore::initialize otherwise).
  void initialize(uint64_t seed);

  // Before the step's program: the tied pair's previous sum is out, the gradients zeroed,
  // and the hooks that start each layer's reductions as its gradients become final.
  void begin_step(ExecutorHooks& hooks);
  // The program's shard instructions and the units' readiness (evaluation's too).
  void shard_hooks(ExecutorHooks& hooks);
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
  UnitShards* units() { return units_.get(); }
  // Whether the gradient norm's squares are split over the whole grid (each value on one
  // rank: ZeRO-1 and the unit shards), or repeated on every replica.
  bool partitions_norm() const { return shards_ || units_; }
  const DataParallelReducer* reducer() const { return reducer_.get(); }
  // The transport scratch of the communicators made here (hybrid sharding's groups) at its
  // most (DeviceComms counts the grid's).
  double reduction_scratch_peak_bytes() const;
  const TiedGradientExchange* tied() const { return tied_.get(); }

 private:
  Parts parts_;
  std::unique_ptr<DataParallelReducer> reducer_;  // dp x cp > 1
  std::unique_ptr<TiedGradientExchange> tied_;    // first and last stage on different ranks, tied head
  std::unique_ptr<OptimizerShards> shards_;       // ZeRO-1
  // parallel.shard_group below the replicas: the group a part spans, its ranks holding the
  // same experts, and the ranks holding the same part in the other groups (declared before
  // units_, which uses them).
  std::unique_ptr<MpiCommunicator> shard_group_, expert_group_, across_;
  std::unique_ptr<UnitShards> units_;  // "gradients" and "weights"
  Communicator* pair_ = nullptr;       // under units_: the tied table's two ranks
  bool holds_head_ = false;            // under units_: this rank's copy of a tied table is the head's
  void update_units(int step, double lr, float grad_scale);
  void gather(const Tensor& src, const Tensor& dst);
  // A tensor-parallel shard, or a replicated parameter on tp rank 0: each value once over tp.
  bool once_over_tp(const Parameter& p) const;
};

}  // namespace pipetrain
