// The dp x pp x tp process grid, split out of a parent communicator (normally
// MPI_COMM_WORLD) with MPI_Comm_split. Rank order: tp fastest, then dp, then pp:
//   world_rank = pp_rank * (dp * tp) + dp_rank * tp + tp_rank.
// The communicators are passed explicitly to whoever needs them; nothing is global.
#pragma once
#include <mpi.h>

#include <memory>

#include "pipetrain/comm/mpi_communicator.hpp"
#include "pipetrain/core/config.hpp"

namespace pipetrain {

struct GridCoords {
  int dp = 0, pp = 0, tp = 0;
};

class Grid {
 public:
  // Throws (on every rank) when dp * pp * tp differs from the parent's size.
  Grid(MPI_Comm parent, const ParallelConfig& p, const std::string& config_source = "");

  int dp() const { return dp_; }
  int pp() const { return pp_; }
  int tp() const { return tp_; }
  int ep() const { return ep_; }
  const GridCoords& coords() const { return me_; }
  int world_rank() const { return world_->rank(); }
  int world_size() const { return world_->size(); }
  int rank_of(GridCoords c) const { return c.pp * dp_ * tp_ + c.dp * tp_ + c.tp; }

  MpiCommunicator& world() { return *world_; }
  MpiCommunicator& tp_comm() { return *tp_comm_; }  // same (dp, pp): tensor-parallel peers
  MpiCommunicator& dp_comm() { return *dp_comm_; }  // same (pp, tp): data-parallel replicas
  MpiCommunicator& pp_comm() { return *pp_comm_; }  // same (dp, tp): the pipeline; rank = pp index
  MpiCommunicator& replica_comm() { return *replica_comm_; }  // same dp: one model replica (pp x tp)
  // Expert parallelism (parallel.ep): the ep consecutive dp ranks that split each MoE layer's
  // experts (rank = dp % ep), and the dp / ep ranks that hold the same experts (rank = dp / ep).
  MpiCommunicator& ep_comm() { return *ep_comm_; }
  MpiCommunicator& expert_dp_comm() { return *expert_dp_comm_; }
  // The ep ranks again, for the backward's exchanges: an F&B pair's forward and backward
  // then post their all-to-alls in whichever order each rank runs them.
  MpiCommunicator& ep_backward_comm() { return *ep_backward_comm_; }
  // Collective over pp_comm(): the pipeline ranks `first` and `last` (which hold the two
  // copies of a tied embedding), or null on the other ranks and when first == last.
  std::unique_ptr<MpiCommunicator> pair_comm(int first, int last, const std::string& name);

 private:
  int dp_, pp_, tp_, ep_;
  GridCoords me_;
  std::unique_ptr<MpiCommunicator> world_, tp_comm_, dp_comm_, pp_comm_, replica_comm_, ep_comm_, expert_dp_comm_,
      ep_backward_comm_;
};

}  // namespace pipetrain
