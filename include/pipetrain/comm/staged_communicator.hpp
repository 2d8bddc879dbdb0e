// StagedCommunicator: a Communicator for tensors in a device's memory over a host one
// (MPI), staging every message through host buffers. An operation waits for the stream's
// earlier work, copies the device data it sends into a host buffer, hands that to the
// host communicator, and copies what arrives back into the device tensor when its request
// completes (wait or test; wait_on blocks the host too: MPI cannot enqueue on a device
// stream). It is comm.p2p = "mpi" on GPUs: pipeline transfers and the tied-embedding sum
// between ranks that may share a GPU, where NCCL cannot run.
#pragma once
#include <memory>
#include <vector>

#include "pipetrain/comm/communicator.hpp"
#include "pipetrain/core/host_allocator.hpp"
#include "pipetrain/core/memory_pool.hpp"

namespace pipetrain {

class StagedCommunicator : public Communicator {
 public:
  // `host` moves host memory (its requests' wait_on takes the host stream); `device`
  // holds the tensors and copies them to and from the host. Both must outlive this.
  StagedCommunicator(Communicator& host, DeviceAllocator& device);

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  std::string name() const override { return host_.name(); }
  int tag_ub() const override { return host_.tag_ub(); }

  std::unique_ptr<CommRequest> allreduce_sum(const Tensor& data, Stream& stream) override;
  std::unique_ptr<CommRequest> allreduce_max(const Tensor& data, Stream& stream) override;
  std::unique_ptr<CommRequest> reduce_sum(const Tensor& data, int root, Stream& stream) override;
  std::unique_ptr<CommRequest> reduce_scatter_sum(const Tensor& send, const Tensor& recv, Stream& stream) override;
  std::unique_ptr<CommRequest> all_gather(const Tensor& send, const Tensor& recv, Stream& stream) override;
  std::unique_ptr<CommRequest> broadcast(const Tensor& data, int root, Stream& stream) override;
  std::unique_ptr<CommRequest> reduce_softmax_partials(const Tensor& data, int root, Stream& stream) override;
  std::unique_ptr<CommRequest> send(const Tensor& data, int peer, int tag, Stream& stream) override;
  std::unique_ptr<CommRequest> recv(const Tensor& data, int peer, int tag, Stream& stream) override;
  void allreduce_sum(double* data, size_t n) override { host_.allreduce_sum(data, n); }
  void allreduce_max(double* data, size_t n) override { host_.allreduce_max(data, n); }
  void barrier() override { host_.barrier(); }

 private:
  // A host copy of `t` (its data copied out when `fill`), after the stream's earlier work.
  Tensor stage(const Tensor& t, const char* op, const char* name, Stream& stream, bool fill);
  std::unique_ptr<CommRequest> finish(std::unique_ptr<CommRequest> inner, Tensor device_dst, std::vector<Tensor> staged);
  Communicator& host_;
  DeviceAllocator& device_;
  HostAllocator host_memory_;
  std::shared_ptr<MemoryPool> staging_;  // host buffers, reused from message to message
};

}  // namespace pipetrain
