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
  // The largest message tag isend/irecv accept (MPI_TAG_UB; the standard guarantees 32767).
  virtual int tag_ub() const = 0;
  // Seconds this rank spent inside blocking collectives and waits since the last reset
  // (how much of a step communication costs).
  double comm_seconds() const { return comm_s_; }
  void reset_comm_seconds() { comm_s_ = 0; }

  virtual void allreduce_sum(float* data, size_t n) = 0;  // in place
  virtual void allreduce_sum(double* data, size_t n) = 0;
  virtual void allreduce_max(double* data, size_t n) = 0;
  virtual void allreduce_max(float* data, size_t n) = 0;
  // recv (recv_count elements) = this rank's block of the sum of every rank's send
  // (size() * recv_count elements, block r for rank r).
  virtual void reduce_scatter_sum(const float* send, float* recv, size_t recv_count) = 0;
  // recv (size() * send_count elements) = every rank's send, in rank order.
  virtual void all_gather(const float* send, float* recv, size_t send_count) = 0;
  virtual void broadcast(float* data, size_t n, int root) = 0;
  virtual void barrier() = 0;

  virtual std::unique_ptr<CommRequest> isend(const float* data, size_t n, int peer, int tag) = 0;
  virtual std::unique_ptr<CommRequest> irecv(float* data, size_t n, int peer, int tag) = 0;
  virtual std::unique_ptr<CommRequest> iallreduce_sum(float* data, size_t n) = 0;

 protected:
  double comm_s_ = 0;
};

}  // namespace pipetrain
