// DeviceComms: the communicators that move this rank's tensors, one per group of the grid.
// On the host they are the Grid's MPI communicators. On a GPU: NCCL for tp and dp (one
// NCCL communicator per group, its unique id broadcast over the group's MPI
// communicator; a dp group whose ranks share a GPU goes over host-staged MPI instead), and for the pipeline and the
// tied-embedding pair NCCL or, with comm.p2p = "mpi", MPI staged through host buffers (ranks may then share a GPU); the
// context-parallel ring is MPI staged through host buffers. Expert parallelism's exchanges
// and the expert-dp sums go over NCCL where the group's ranks have a GPU each, else
// host-staged MPI. A group of one rank never moves data; it gets the staged path. Host
// scalars (norms, metrics) always go over the Grid's MPI communicators.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "pipetrain/comm/communicator.hpp"
#include "pipetrain/core/device_allocator.hpp"
#include "pipetrain/topology/grid.hpp"

namespace pipetrain {

// What names a rank's GPU to its peers: its UUID (DeviceAllocator::hardware_id), which does
// not depend on the ordinal CUDA_VISIBLE_DEVICES gives it (under the shipped Slurm scripts
// every rank sees its GPU as device 0); where the backend names none, the node and the ordinal.
std::string gpu_identity(const DeviceAllocator& device);
// The first two ranks whose identities are equal: they would share one GPU. None: every
// rank has its own.
std::optional<std::pair<int, int>> ranks_sharing_a_gpu(const std::vector<std::string>& ids);

class DeviceComms {
 public:
  // Collective over grid.world(). `device` holds the tensors (its device() decides host
  // or GPU); `p2p` is comm.p2p ("auto", "nccl" or "mpi"); tied_first / tied_last are the
  // pipeline ranks of the two tied-embedding copies. Throws Error on every rank when NCCL
  // is asked for but missing, or when two ranks of an NCCL group share a GPU.
  DeviceComms(Grid& grid, DeviceAllocator& device, const std::string& p2p, int tied_first, int tied_last);
  ~DeviceComms();
  DeviceComms(const DeviceComms&) = delete;
  DeviceComms& operator=(const DeviceComms&) = delete;

  Communicator& tp() { return *tp_; }
  Communicator& dp() { return *dp_; }
  Communicator& pp() { return *pp_; }
  Communicator* cp() { return cp_; }      // the context-parallel ring (null on a GPU without one)
  Communicator* tied() { return tied_; }  // null unless this rank holds one of two distinct copies
  // Expert parallelism (the Grid's comm("ep"), comm("ep", 1) and comm("edp")): the forward's and the backward's
  // exchanges and the ranks holding the same experts; null without expert parallelism.
  Communicator* ep() { return ep_; }
  Communicator* ep_backward() { return ep_backward_; }
  Communicator* expert_dp() { return expert_dp_; }
  // The expert exchanges go over NCCL, which needs every ep rank to post the operations of
  // its communicators (ep, ep backward, dp, ...) in the same order: F&B pairs then take
  // fixed turns instead of whichever is ready.
  bool ep_in_order() const { return ep_nccl_; }
  // Pipeline messages match in the order they are posted (NCCL): the program must pass
  // validate_in_order (schedule/program.hpp).
  bool pp_in_order() const { return pp_nccl_; }
  // The tied pair's operations run in their stream's order (NCCL): a send posted early
  // would hold back the compute queued after it until the peer receives.
  bool tied_in_order() const { return tied_nccl_; }
  // The reductions' transport scratch at its most (Communicator::reduction_scratch_peak_bytes),
  // summed over the distinct communicators: at least what they held at once.
  double reduction_scratch_peak_bytes() const;
  // For the run header, e.g. "tp nccl, dp nccl, pp mpi (host-staged)".
  std::string summary() const { return summary_; }

 private:
  std::unique_ptr<Communicator> own_tp_, own_dp_, own_pp_, own_tied_, own_cp_, own_ep_, own_ep_backward_,
      own_expert_dp_;
  std::unique_ptr<MpiCommunicator> tied_mpi_;  // the pair's MPI communicator (under a staged or NCCL one on GPUs)
  Communicator *tp_ = nullptr, *dp_ = nullptr, *pp_ = nullptr, *tied_ = nullptr, *cp_ = nullptr, *ep_ = nullptr,
               *ep_backward_ = nullptr, *expert_dp_ = nullptr;
  bool pp_nccl_ = false, tied_nccl_ = false, ep_nccl_ = false;
  std::string summary_;
};

}  // namespace pipetrain
