// NcclCommunicator (pipetrain/comm/nccl_communicator.hpp). Compiled when the build finds
// CUDA and NCCL; nccl_communicator_disabled.cpp otherwise.
#include "pipetrain/comm/nccl_communicator.hpp"

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>

#include <chrono>
#include <exception>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "pipetrain/comm/mpi_communicator.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/core/fault.hpp"
#include "pipetrain/core/watchdog.hpp"

namespace pipetrain {

namespace {

void check(ncclResult_t r, const char* what, const std::string& comm) {
  if (r != ncclSuccess) fail("NCCL {} on the {} communicator failed: {}", what, comm, ncclGetErrorString(r));
}

void check_cuda(cudaError_t e, const char* what, const std::string& comm) {
  if (e != cudaSuccess) fail("CUDA {} for the {} communicator failed: {}", what, comm, cudaGetErrorString(e));
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::I32: return ncclInt32;
  }
  return ncclUint8;
}

// A CUDA event (shared by a request and, inside a group, the communicator that records
// it when the group is launched).
struct Event {
  explicit Event(const std::string& comm) {
    check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "event create", comm);
  }
  ~Event() { (void)cudaEventDestroy(event); }  // never waits
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t event = nullptr;
  bool recorded = false;  // false until the operation is launched (an open group's)
};

// Fails when NCCL reports an asynchronous error: a peer that died or a network failure
// would otherwise leave this rank waiting on an event that never completes until the
// watchdog fires. (The communicator's destructor aborts it as the error unwinds.)
void check_async(ncclComm_t comm, const std::string& name) {
  ncclResult_t r = ncclSuccess;
  check(ncclCommGetAsyncError(comm, &r), "async error query", name);
  if (r == ncclSuccess || r == ncclInProgress) return;
  fail("NCCL on the {} communicator failed while an operation was in flight: {} (a peer failed or left)", name,
       ncclGetErrorString(r));
}

// An operation's completion: an event recorded on its stream right after it (after the
// group's launch for an operation inside group_begin / group_end).
class NcclRequest final : public CommRequest {
 public:
  NcclRequest(std::shared_ptr<Event> event, ncclComm_t nccl, std::string comm, double& timer)
      : event_(std::move(event)), nccl_(nccl), comm_(std::move(comm)), timer_(timer) {}
  // Polls the event and NCCL's error state in turn (not cudaEventSynchronize, which would
  // wait on a dead peer for ever).
  void wait() override {
    if (!event_->recorded) fail("an NCCL operation on the {} communicator was waited for inside its group", comm_);
    watchdog::Waiting waiting("an NCCL operation on the " + comm_ + " communicator");
    const double t0 = MPI_Wtime();
    while (!test()) std::this_thread::sleep_for(std::chrono::microseconds(20));
    timer_ += MPI_Wtime() - t0;
  }
  bool test() override {
    if (!event_->recorded) return false;  // its group is not launched yet
    const cudaError_t e = cudaEventQuery(event_->event);
    if (e == cudaErrorNotReady) {
      check_async(nccl_, comm_);
      return false;
    }
    check_cuda(e, "event query", comm_);
    return true;
  }
  void wait_on(Stream& stream) override {
    if (!event_->recorded) fail("an NCCL operation on the {} communicator was waited for inside its group", comm_);
    check_cuda(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream.native_handle()), event_->event, 0),
               "stream wait", comm_);
  }

 private:
  std::shared_ptr<Event> event_;
  ncclComm_t nccl_;
  std::string comm_;
  double& timer_;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(MPI_Comm comm, std::string name, int device)
      : host_(std::make_unique<MpiCommunicator>(comm, name)), name_(std::move(name)), device_(device) {
    // Rank 0's id goes out with its outcome, so a failure there ends every rank with its
    // message instead of leaving the others in the broadcast.
    struct {
      ncclUniqueId id;
      ncclResult_t status;
    } root{};
    if (host_->rank() == 0) root.status = ncclGetUniqueId(&root.id);
    if (MPI_Bcast(&root, sizeof root, MPI_BYTE, 0, host_->comm()) != MPI_SUCCESS)
      fail("broadcasting the NCCL id on the {} communicator failed", name_);
    if (root.status != ncclSuccess)
      fail("NCCL get unique id on rank 0 of the {} communicator failed: {}", name_, ncclGetErrorString(root.status));
    check_cuda(cudaSetDevice(device_), "set device", name_);
    // A rank whose init fails throws at once: the job's fail-fast handler ends the others.
    check(ncclCommInitRank(&comm_, host_->size(), root.id, host_->rank()), "init", name_);
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream create", name_);
    check_cuda(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "event create", name_);
  }
  ~NcclCommunicator() override {
    // While an error unwinds a peer may be gone: abort (never blocks) instead of destroy.
    const bool unwinding = std::uncaught_exceptions() > 0;
    if (unwinding) {
      (void)ncclCommAbort(comm_);
    } else {
      (void)cudaStreamSynchronize(stream_);
      (void)ncclCommDestroy(comm_);
    }
    (void)cudaEventDestroy(ready_);
    (void)cudaStreamDestroy(stream_);
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  std::string name() const override { return name_; }
  int tag_ub() const override { return host_->tag_ub(); }

  std::unique_ptr<CommRequest> allreduce_sum(const Tensor& data, Stream& stream) override {
    return allreduce(data, stream, ncclSum, "all-reduce");
  }
  std::unique_ptr<CommRequest> allreduce_max(const Tensor& data, Stream& stream) override {
    return allreduce(data, stream, ncclMax, "all-reduce (max)");
  }
  std::unique_ptr<CommRequest> reduce_sum(const Tensor& data, int root, Stream& stream) override {
    fault::point("collective");
    cudaStream_t s = on_device("reduce", data, "data", stream);
    check_dtype("reduce", "data", data, DType::F32);
    if (root < 0 || root >= size()) fail("reduce on the {} communicator: root {} of {} ranks", name_, root, size());
    // In place (sendbuff == recvbuff): only the root's buffer is written.
    check(ncclReduce(data.raw(), data.raw(), static_cast<size_t>(data.numel()), ncclFloat32, ncclSum, root, comm_, s),
          "reduce", name_);
    return done(s);
  }
  std::unique_ptr<CommRequest> reduce_scatter_sum(const Tensor& send, const Tensor& recv, Stream& stream) override {
    fault::point("collective");
    cudaStream_t s = on_device("reduce-scatter", send, "send", stream);
    on_device("reduce-scatter", recv, "recv", stream);
    check_dtype("reduce-scatter", "send", send, DType::F32);
    check_dtype("reduce-scatter", "recv", recv, DType::F32);
    if (send.numel() != recv.numel() * size())
      fail("reduce-scatter on the {} communicator: send has {} elements, recv {} ({} ranks)", name_, send.numel(),
           recv.numel(), size());
    check(ncclReduceScatter(send.raw(), recv.raw(), static_cast<size_t>(recv.numel()), ncclFloat32, ncclSum, comm_, s),
          "reduce-scatter", name_);
    return done(s);
  }
  std::unique_ptr<CommRequest> all_gather(const Tensor& send, const Tensor& recv, Stream& stream) override {
    fault::point("collective");
    cudaStream_t s = on_device("all-gather", send, "send", stream);
    on_device("all-gather", recv, "recv", stream);
    check_same_kind("all-gather", "send", send, "recv", recv);
    if (recv.numel() != send.numel() * size())
      fail("all-gather on the {} communicator: send has {} elements, recv {} ({} ranks)", name_, send.numel(),
           recv.numel(), size());
    // In place when send is this rank's block of recv (NCCL's own in-place rule).
    check(ncclAllGather(send.raw(), recv.raw(), static_cast<size_t>(send.numel()), nccl_type(send.dtype()), comm_, s),
          "all-gather", name_);
    return done(s);
  }
  std::unique_ptr<CommRequest> broadcast(const Tensor& data, int root, Stream& stream) override {
    fault::point("collective");
    cudaStream_t s = on_device("broadcast", data, "data", stream);
    check(ncclBroadcast(data.raw(), data.raw(), static_cast<size_t>(data.numel()), nccl_type(data.dtype()), root,
                        comm_, s),
          "broadcast", name_);
    return done(s);
  }
  std::unique_ptr<CommRequest> send(const Tensor& data, int peer, int /*tag*/, Stream& stream) override {
    cudaStream_t s = on_device("send", data, "data", stream);
    check(ncclSend(data.raw(), static_cast<size_t>(data.numel()), nccl_type(data.dtype()), peer, comm_, s), "send",
          name_);
    return done(s);
  }
  std::unique_ptr<CommRequest> recv(const Tensor& data, int peer, int /*tag*/, Stream& stream) override {
    cudaStream_t s = on_device("recv", data, "data", stream);
    check(ncclRecv(data.raw(), static_cast<size_t>(data.numel()), nccl_type(data.dtype()), peer, comm_, s), "recv",
          name_);
    return done(s);
  }

  void allreduce_sum(double* data, size_t n) override { host_->allreduce_sum(data, n); }
  void allreduce_max(double* data, size_t n) override { host_->allreduce_max(data, n); }
  void barrier() override { host_->barrier(); }

  void group_begin() override {
    if (in_group_) fail("group_begin on the {} communicator: a group is already open", name_);
    check(ncclGroupStart(), "group start", name_);
    in_group_ = true;
  }
  void group_end() override {
    if (!in_group_) fail("group_end on the {} communicator: no group is open", name_);
    in_group_ = false;
    check(ncclGroupEnd(), "group end", name_);
    for (auto& [event, stream] : pending_) record(*event, stream);
    pending_.clear();
  }

 private:
  std::unique_ptr<CommRequest> allreduce(const Tensor& data, Stream& stream, ncclRedOp_t op, const char* what) {
    fault::point("collective");
    cudaStream_t s = on_device(what, data, "data", stream);
    check_dtype(what, "data", data, DType::F32);
    check(ncclAllReduce(data.raw(), data.raw(), static_cast<size_t>(data.numel()), ncclFloat32, op, comm_, s), what,
          name_);
    return done(s);
  }
  // The communicator's own stream, ordered after the work already on the caller's (so the
  // operation overlaps what the caller enqueues next), after checking that tensor and stream
  // are on this device. Requests complete on it: wait_on(stream) orders a stream after them.
  cudaStream_t on_device(const char* op, const Tensor& t, const char* what, Stream& stream) {
    const DeviceId mine{DeviceKind::Cuda, device_};
    if (t.device() != mine || stream.device() != mine)
      fail("{} on the {} communicator (NCCL on {}): {} is {} and the stream is on {}", op, name_, mine.str(), what,
           t.describe(), stream.device().str());
    check_cuda(cudaEventRecord(ready_, static_cast<cudaStream_t>(stream.native_handle())), "event record", name_);
    check_cuda(cudaStreamWaitEvent(stream_, ready_, 0), "stream wait", name_);
    return stream_;
  }
  void record(Event& e, cudaStream_t s) {
    check_cuda(cudaEventRecord(e.event, s), "event record", name_);
    e.recorded = true;
  }
  std::unique_ptr<CommRequest> done(cudaStream_t s) {
    auto event = std::make_shared<Event>(name_);
    if (in_group_)
      pending_.emplace_back(event, s);  // the operations are launched by group_end
    else
      record(*event, s);
    return std::make_unique<NcclRequest>(std::move(event), comm_, name_, comm_s_);
  }

  std::unique_ptr<MpiCommunicator> host_;
  std::string name_;
  int device_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;  // every operation runs here (its own, beside the compute stream)
  cudaEvent_t ready_ = nullptr;    // the caller's stream up to an operation (reused: waits capture it)
  bool in_group_ = false;
  std::vector<std::pair<std::shared_ptr<Event>, cudaStream_t>> pending_;  // recorded at group_end
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, std::string name, int device) {
  return std::make_unique<NcclCommunicator>(comm, std::move(name), device);
}

bool nccl_available(std::string* /*why*/) { return true; }

std::string nccl_build_summary() { return fmt::format("{}.{}.{}", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH); }

}  // namespace pipetrain
