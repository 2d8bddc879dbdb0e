// MpiCommunicator: Communicator over an MPI communicator (host memory).
#pragma once
#include <mpi.h>

#include "pipetrain/comm/communicator.hpp"

namespace pipetrain {

class MpiCommunicator : public Communicator {
 public:
  // Takes ownership of `comm` (freed in the destructor) unless it is MPI_COMM_WORLD/SELF.
  MpiCommunicator(MPI_Comm comm, std::string name);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }
  int tag_ub() const override { return tag_ub_; }
  MPI_Comm comm() const { return comm_; }

  void allreduce_sum(float* data, size_t n) override;
  void allreduce_sum(double* data, size_t n) override;
  void allreduce_max(double* data, size_t n) override;
  void allreduce_max(float* data, size_t n) override;
  void reduce_scatter_sum(const float* send, float* recv, size_t recv_count) override;
  void all_gather(const float* send, float* recv, size_t send_count) override;
  void broadcast(float* data, size_t n, int root) override;
  void barrier() override;
  std::unique_ptr<CommRequest> isend(const float* data, size_t n, int peer, int tag) override;
  std::unique_ptr<CommRequest> irecv(float* data, size_t n, int peer, int tag) override;
  std::unique_ptr<CommRequest> iallreduce_sum(float* data, size_t n) override;

 private:
  MPI_Comm comm_;
  std::string name_;
  int rank_ = 0, size_ = 1;
  int tag_ub_ = 32767;
};

}  // namespace pipetrain
