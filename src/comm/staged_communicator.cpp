#include "pipetrain/comm/staged_communicator.hpp"

#include <chrono>
#include <vector>

#include "pipetrain/core/error.hpp"

namespace pipetrain {

namespace {

// The host request, then (once) the copy of the arrived data back into device memory.
class StagedRequest : public CommRequest {
 public:
  // `staged`: the host buffers the operation uses (kept until it completes); the last one
  // is copied into `device_dst` if that is defined.
  StagedRequest(std::unique_ptr<CommRequest> inner, Tensor device_dst, std::vector<Tensor> staged,
                DeviceAllocator& device, double& timer)
      : inner_(std::move(inner)), dst_(std::move(device_dst)), staged_(std::move(staged)), device_(device),
        timer_(timer) {}
  void wait() override {
    const auto t0 = std::chrono::steady_clock::now();
    inner_->wait();
    timer_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    land();
  }
  bool test() override {
    if (!inner_->test()) return false;
    land();
    return true;
  }
  void wait_on(Stream& /*device stream*/) override { wait(); }

 private:
  void land() {
    if (dst_.defined()) device_.to_device(dst_.raw(), staged_.back().raw(), dst_.bytes());
    dst_ = Tensor();
    staged_.clear();  // the staging buffers go back to the pool
  }
  std::unique_ptr<CommRequest> inner_;
  Tensor dst_;
  std::vector<Tensor> staged_;
  DeviceAllocator& device_;
  double& timer_;
};

}  // namespace

StagedCommunicator::StagedCommunicator(Communicator& host, DeviceAllocator& device)
    : host_(host), device_(device), staging_(MemoryPool::create(host_memory_)) {}

Tensor StagedCommunicator::stage(const Tensor& t, const char* op, const char* name, Stream& stream, bool fill) {
  if (t.device() != device_.device() || stream.device() != device_.device())
    fail("{} on the {} communicator (host-staged, {} memory): {} is {} and the stream is on {}", op, host_.name(),
         device_.device().str(), name, t.describe(), stream.device().str());
  Tensor h = Tensor::empty(*staging_, t.shape(), t.dtype());
  if (fill) {
    stream.synchronize();  // the data is what the stream's earlier work left there
    device_.to_host(h.raw(), t.raw(), t.bytes());
  }
  return h;
}

std::unique_ptr<CommRequest> StagedCommunicator::finish(std::unique_ptr<CommRequest> inner, Tensor device_dst,
                                                        std::vector<Tensor> staged) {
  return std::make_unique<StagedRequest>(std::move(inner), std::move(device_dst), std::move(staged), device_,
                                         comm_s_);
}

std::unique_ptr<CommRequest> StagedCommunicator::allreduce_sum(const Tensor& data, Stream& stream) {
  Tensor h = stage(data, "all-reduce", "data", stream, true);
  return finish(host_.allreduce_sum(h, host_stream()), data, {h});
}

std::unique_ptr<CommRequest> StagedCommunicator::allreduce_max(const Tensor& data, Stream& stream) {
  Tensor h = stage(data, "all-reduce (max)", "data", stream, true);
  return finish(host_.allreduce_max(h, host_stream()), data, {h});
}

std::unique_ptr<CommRequest> StagedCommunicator::reduce_sum(const Tensor& data, int root, Stream& stream) {
  Tensor h = stage(data, "reduce", "data", stream, true);
  return finish(host_.reduce_sum(h, root, host_stream()), rank() == root ? data : Tensor(), {h});
}

std::unique_ptr<CommRequest> StagedCommunicator::reduce_softmax_partials(const Tensor& data, int root,
                                                                         Stream& stream) {
  Tensor h = stage(data, "reduce (softmax partials)", "data", stream, true);
  return finish(host_.reduce_softmax_partials(h, root, host_stream()), root < 0 || rank() == root ? data : Tensor(),
                {h});
}

std::unique_ptr<CommRequest> StagedCommunicator::reduce_scatter_sum(const Tensor& send, const Tensor& recv,
                                                                    Stream& stream) {
  Tensor hs = stage(send, "reduce-scatter", "send", stream, true);
  Tensor hr = stage(recv, "reduce-scatter", "recv", stream, false);
  auto inner = host_.reduce_scatter_sum(hs, hr, host_stream());
  return finish(std::move(inner), recv, {hs, hr});
}

std::unique_ptr<CommRequest> StagedCommunicator::all_gather(const Tensor& send, const Tensor& recv, Stream& stream) {
  Tensor hs = stage(send, "all-gather", "send", stream, true);
  Tensor hr = stage(recv, "all-gather", "recv", stream, false);
  return finish(host_.all_gather(hs, hr, host_stream()), recv, {hs, hr});
}

std::unique_ptr<CommRequest> StagedCommunicator::broadcast(const Tensor& data, int root, Stream& stream) {
  Tensor h = stage(data, "broadcast", "data", stream, rank() == root);
  return finish(host_.broadcast(h, root, host_stream()), data, {h});
}

std::unique_ptr<CommRequest> StagedCommunicator::send(const Tensor& data, int peer, int tag, Stream& stream) {
  Tensor h = stage(data, "send", "data", stream, true);
  return finish(host_.send(h, peer, tag, host_stream()), Tensor(), {h});
}

std::unique_ptr<CommRequest> StagedCommunicator::recv(const Tensor& data, int peer, int tag, Stream& stream) {
  Tensor h = stage(data, "recv", "data", stream, false);
  return finish(host_.recv(h, peer, tag, host_stream()), data, {h});
}

}  // namespace pipetrain
