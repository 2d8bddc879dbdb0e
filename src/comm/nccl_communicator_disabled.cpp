// The NCCL entry points of a build without NCCL (no CUDA, or libnccl not found): they
// exist so that callers need no #ifdef, and say how to get NCCL.
#include "pipetrain/comm/nccl_communicator.hpp"
#include "pipetrain/core/error.hpp"

namespace pipetrain {

namespace {
constexpr const char* kNotBuilt =
    "this pipetrain was built without NCCL (configure with CUDA and NCCL found, e.g. -DNCCL_ROOT=/usr/local/cuda)";
}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm, std::string, int) { throw Error(kNotBuilt); }

bool nccl_available(std::string* why) {
  if (why != nullptr) *why = kNotBuilt;
  return false;
}

std::string nccl_build_summary() { return "not built"; }

}  // namespace pipetrain
