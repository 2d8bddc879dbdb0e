// Communicator: the collectives and point-to-point messages the runtime and the
// parallel layers need, on device buffers. MpiCommunicator (host memory) lives in
// mpi_communicator.hpp; an NCCL one (device memory) implements the same interface.
#pragma once
#include <cstddef>
#include <memory>
#include <string>

namespace pipetrain {

// A nonblocking operation in flight.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  virtual void wait() = 0;
  virtual bool test() = 0;  // true once complete
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // e.g. "pp" — used in error messages

  virtual void allreduce_sum(float* data, size_t n) = 0;  // in place
  virtual void allreduce_sum(double* data, size_t n) = 0;
  virtual void allreduce_max(double* data, size_t n) = 0;
  virtual void broadcast(float* data, size_t n, int root) = 0;
  virtual void barrier() = 0;

  virtual std::unique_ptr<CommRequest> isend(const float* data, size_t n, int peer, int tag) = 0;
  virtual std::unique_ptr<CommRequest> irecv(float* data, size_t n, int peer, int tag) = 0;
  virtual std::unique_ptr<CommRequest> iallreduce_sum(float* data, size_t n) = 0;
};

}  // namespace pipetrain
