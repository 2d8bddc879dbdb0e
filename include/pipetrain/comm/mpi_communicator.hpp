// MpiCommunicator: Communicator over an MPI communicator, on host tensors and the host
// stream. Every operation is a nonblocking MPI call; its request's wait() is MPI_Wait.
#pragma once
#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <memory>

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
  double reduction_scratch_peak_bytes() const override { return static_cast<double>(scratch_->peak.load()); }

  // The scratch Open MPI's nonblocking reductions (libnbc) allocate per call and free at
  // completion: the message for an all-reduce and for a reduce's root, twice it for a
  // reduce's other ranks. Counted from the call to the request's observed completion.
  struct ScratchMeter {
    std::atomic<int64_t> now{0}, peak{0};
    void add(int64_t bytes);
    void release(int64_t bytes) { now -= bytes; }
  };

 private:
  std::unique_ptr<CommRequest> iallreduce(const Tensor& data, Stream& stream, MPI_Op op, const char* what);
  MPI_Comm comm_;
  std::string name_;
  int rank_ = 0, size_ = 1;
  int tag_ub_ = 32767;
  std::shared_ptr<ScratchMeter> scratch_ = std::make_shared<ScratchMeter>();  // shared with its requests
};

}  // namespace pipetrain
