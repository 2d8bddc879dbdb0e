// MpiCommunicator: Communicator over an MPI communicator, on host tensors and the host
// stream. Every operation is a nonblocking MPI call; its request's wait() is MPI_Wait.
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

  std::unique_ptr<CommRequest> allreduce_sum(const Tensor& data, Stream& stream) override;
  std::unique_ptr<CommRequest> allreduce_max(const Tensor& data, Stream& stream) override;
  std::unique_ptr<CommRequest> reduce_sum(const Tensor& data, int root, Stream& stream) override;
  std::unique_ptr<CommRequest> reduce_scatter_sum(const Tensor& send, const Tensor& recv, Stream& stream) override;
  std::unique_ptr<CommRequest> all_gather(const Tensor& send, const Tensor& recv, Stream& stream) override;
  std::unique_ptr<CommRequest> broadcast(const Tensor& data, int root, Stream& stream) override;
  std::unique_ptr<CommRequest> reduce_softmax_partials(const Tensor& data, int root, Stream& stream) override;
  std::unique_ptr<CommRequest> all_to_all_v(const Tensor& send, const std::vector<int64_t>& send_counts,
                                            const Tensor& recv, const std::vector<int64_t>& recv_counts,
                                            Stream& stream) override;
  std::unique_ptr<CommRequest> send(const Tensor& data, int peer, int tag, Stream& stream) override;
  std::unique_ptr<CommRequest> recv(const Tensor& data, int peer, int tag, Stream& stream) override;
  void allreduce_sum(double* data, size_t n) override;
  void allreduce_max(double* data, size_t n) override;
  void barrier() override;

 private:
  std::unique_ptr<CommRequest> iallreduce(const Tensor& data, Stream& stream, MPI_Op op, const char* what);
  MPI_Comm comm_;
  std::string name_;
  int rank_ = 0, size_ = 1;
  int tag_ub_ = 32767;
};

}  // namespace pipetrain
