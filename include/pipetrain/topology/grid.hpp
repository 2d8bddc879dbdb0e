// The dp x pp x cp x tp process grid, split out of a parent communicator (normally
// MPI_COMM_WORLD) with MPI_Comm_split. Rank order: tp fastest, then cp, then dp, then pp:
//   world_rank = ((pp_rank * dp + dp_rank) * cp + cp_rank) * tp + tp_rank,
// so a stage's tp groups, and the cp ranks sharing one sequence, are neighbours. The cp
// ranks of a dp replica read the same samples (each its chunks of every sequence) and hold
// the same parameters: the gradients sum over dp x cp (dp_comm).
// The communicators are passed explicitly to whoever needs them; nothing is global.
#pragma once
#include <mpi.h>

#include <memory>

#include "pipetrain/comm/mpi_communicator.hpp"
#include "pipetrain/core/config.hpp"

namespace pipetrain {

struct GridCoords {
  int dp = 0, pp = 0, tp = 0, cp = 0;
};

class Grid {
 public:
  // Throws (on every rank) when dp * pp * cp * tp differs from the parent's size.
  Grid(MPI_Comm parent, const ParallelConfig& p, const std::string& config_source = "");

  int dp() const { return dp_; }
  int pp() const { return pp_; }
  int tp() const { return tp_; }
  int cp() const { return cp_; }
  int ep() const { return ep_; }
  const GridCoords& coords() const { return me_; }
  int world_rank() const { return world_->rank(); }
  int world_size() const { return world_->size(); }
  int rank_of(GridCoords c) const { return ((c.pp * dp_ + c.dp) * cp_ + c.cp) * tp_ + c.tp; }

  MpiCommunicator& world() { return *world_; }
  MpiCommunicator& tp_comm() { return *tp_comm_; }  // same (dp, pp, cp): tensor-parallel peers
  // Same (pp, tp): the ranks holding the same parameters, dp x cp of them (rank dp * cp +
  // cp), over which gradients are summed and ZeRO-1 shares out the optimizer.
  MpiCommunicator& dp_comm() { return *dp_comm_; }
  MpiCommunicator& pp_comm() { return *pp_comm_; }            // same (dp, cp, tp): the pipeline; rank = pp index
  MpiCommunicator& replica_comm() { return *replica_comm_; }  // same (dp, cp): one model replica (pp x tp)
  MpiCommunicator& cp_comm() { return *cp_comm_; }            // same (dp, pp, tp): one sequence's ring; rank = cp index
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
  int dp_, pp_, tp_, cp_, ep_;
  GridCoords me_;
  std::unique_ptr<MpiCommunicator> world_, tp_comm_, dp_comm_, pp_comm_, replica_comm_, cp_comm_, ep_comm_,
      expert_dp_comm_, ep_backward_comm_;
};

}  // namespace pipetrain
