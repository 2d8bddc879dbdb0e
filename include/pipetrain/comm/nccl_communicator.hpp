// NcclCommunicator: Communicator over NCCL on CUDA device tensors, enqueued on a CUDA
// stream (the backend's, or a communication stream) without blocking the host; each
// operation's request is a CUDA event recorded after it (wait: cudaEventSynchronize,
// wait_on: cudaStreamWaitEvent). The NCCL unique id is bootstrapped over the MPI
// communicator it is built from, which also carries the host-scalar reductions. NCCL has
// no message tags: sends and receives between two ranks match in the order they are
// issued. Exports: make_nccl_communicator, nccl_available, nccl_build_summary.
#pragma once
#include <mpi.h>

#include <memory>
#include <string>

#include "pipetrain/comm/communicator.hpp"

namespace pipetrain {

// Collective over `comm` (whose ownership it takes, as MpiCommunicator does); `device`
// is this rank's CUDA ordinal. Throws Error when the build has no NCCL.
std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, std::string name, int device);
// Whether this build links NCCL (false with the reason in *why otherwise).
bool nccl_available(std::string* why = nullptr);
// "2.28.3" or "not built".
std::string nccl_build_summary();

}  // namespace pipetrain
