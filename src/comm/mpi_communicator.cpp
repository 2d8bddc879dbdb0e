#include "pipetrain/comm/mpi_communicator.hpp"

#include <climits>

#include "pipetrain/core/error.hpp"
#include "pipetrain/core/fault.hpp"
#include "pipetrain/core/watchdog.hpp"

namespace pipetrain {

namespace {

// Adds the lifetime of the scope to a counter.
class Timed {
 public:
  explicit Timed(double& acc, std::string what = "an MPI operation")
      : acc_(acc), t0_(MPI_Wtime()), waiting_(std::move(what)) {}
  ~Timed() { acc_ += MPI_Wtime() - t0_; }
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;

 private:
  double& acc_;
  double t0_;
  watchdog::Waiting waiting_;
};

void check(int rc, const char* what, const std::string& comm) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  fail("MPI {} on the {} communicator failed: {}", what, comm, std::string(msg, static_cast<size_t>(len)));
}

int count_of(size_t n, const std::string& comm) {
  if (n > static_cast<size_t>(INT_MAX)) fail("message of {} elements too large for MPI on {}", n, comm);
  return static_cast<int>(n);
}

// Never blocks in its destructor: an operation still in flight there (an error is
// unwinding, or its owner gave up on it) is cancelled if it is a receive and abandoned
// (MPI_Request_free) either way, so no rank waits on a peer that may be gone.
class MpiRequest : public CommRequest {
 public:
  MpiRequest(std::string comm, double& timer, bool receive)
      : comm_(std::move(comm)), timer_(timer), receive_(receive) {}
  ~MpiRequest() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (req_ == MPI_REQUEST_NULL || finalized) return;
    int done = 0;
    if (MPI_Test(&req_, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) return;
    if (receive_) MPI_Cancel(&req_);
    MPI_Request_free(&req_);
  }
  void wait() override {
    Timed t(timer_, what_.empty() ? "a message on the " + comm_ + " communicator" : what_);
    check(MPI_Wait(&req_, MPI_STATUS_IGNORE), "wait", comm_);
  }
  bool test() override {
    int done = 0;
    check(MPI_Test(&req_, &done, MPI_STATUS_IGNORE), "test", comm_);
    return done != 0;
  }
  MPI_Request* get() { return &req_; }
  void describe(std::string what) { what_ = std::move(what); }

 private:
  MPI_Request req_ = MPI_REQUEST_NULL;
  std::string comm_;
  double& timer_;
  bool receive_;
  std::string what_;
};

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name) : comm_(comm), name_(std::move(name)) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  // MPI_TAG_UB is an attribute of MPI_COMM_WORLD (the same for every communicator).
  int* ub = nullptr;
  int found = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &found);
  if (found && ub) tag_ub_ = *ub;
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_SELF && comm_ != MPI_COMM_NULL)
    MPI_Comm_free(&comm_);
}

void MpiCommunicator::allreduce_sum(float* data, size_t n) {
  fault::point("collective");
  Timed timed(comm_s_, "a collective on the " + name_ + " communicator");
  if (size_ == 1) return;
  check(MPI_Allreduce(MPI_IN_PLACE, data, count_of(n, name_), MPI_FLOAT, MPI_SUM, comm_), "allreduce", name_);
}

void MpiCommunicator::allreduce_sum(double* data, size_t n) {
  fault::point("collective");
  Timed timed(comm_s_, "a collective on the " + name_ + " communicator");
  if (size_ == 1) return;
  check(MPI_Allreduce(MPI_IN_PLACE, data, count_of(n, name_), MPI_DOUBLE, MPI_SUM, comm_), "allreduce", name_);
}

void MpiCommunicator::allreduce_max(double* data, size_t n) {
  fault::point("collective");
  Timed timed(comm_s_, "a collective on the " + name_ + " communicator");
  if (size_ == 1) return;
  check(MPI_Allreduce(MPI_IN_PLACE, data, count_of(n, name_), MPI_DOUBLE, MPI_MAX, comm_), "allreduce", name_);
}

void MpiCommunicator::allreduce_max(float* data, size_t n) {
  fault::point("collective");
  Timed timed(comm_s_, "a collective on the " + name_ + " communicator");
  if (size_ == 1) return;
  check(MPI_Allreduce(MPI_IN_PLACE, data, count_of(n, name_), MPI_FLOAT, MPI_MAX, comm_), "allreduce", name_);
}

void MpiCommunicator::reduce_scatter_sum(const float* send, float* recv, size_t recv_count) {
  fault::point("collective");
  Timed timed(comm_s_, "a collective on the " + name_ + " communicator");
  check(MPI_Reduce_scatter_block(send, recv, count_of(recv_count, name_), MPI_FLOAT, MPI_SUM, comm_),
        "reduce-scatter", name_);
}

void MpiCommunicator::all_gather(const float* send, float* recv, size_t send_count) {
  fault::point("collective");
  Timed timed(comm_s_, "a collective on the " + name_ + " communicator");
  const int n = count_of(send_count, name_);
  // A rank's own block already in place in recv: MPI_IN_PLACE.
  const void* s = send == recv + static_cast<size_t>(rank_) * send_count ? MPI_IN_PLACE : send;
  check(MPI_Allgather(s, n, MPI_FLOAT, recv, n, MPI_FLOAT, comm_), "all-gather", name_);
}

void MpiCommunicator::broadcast(float* data, size_t n, int root) {
  fault::point("collective");
  Timed timed(comm_s_, "a collective on the " + name_ + " communicator");
  if (size_ == 1) return;
  check(MPI_Bcast(data, count_of(n, name_), MPI_FLOAT, root, comm_), "broadcast", name_);
}

void MpiCommunicator::barrier() {
  fault::point("collective");
  check(MPI_Barrier(comm_), "barrier", name_); }

std::unique_ptr<CommRequest> MpiCommunicator::isend(const float* data, size_t n, int peer, int tag) {
  auto r = std::make_unique<MpiRequest>(name_, comm_s_, false);
  r->describe(fmt::format("the send of message {} to rank {} of the {} communicator to complete", tag, peer, name_));
  check(MPI_Isend(data, count_of(n, name_), MPI_FLOAT, peer, tag, comm_, r->get()), "isend", name_);
  return r;
}

std::unique_ptr<CommRequest> MpiCommunicator::irecv(float* data, size_t n, int peer, int tag) {
  auto r = std::make_unique<MpiRequest>(name_, comm_s_, true);
  r->describe(fmt::format("message {} from rank {} of the {} communicator", tag, peer, name_));
  check(MPI_Irecv(data, count_of(n, name_), MPI_FLOAT, peer, tag, comm_, r->get()), "irecv", name_);
  return r;
}

std::unique_ptr<CommRequest> MpiCommunicator::iallreduce_sum(float* data, size_t n) {
  fault::point("collective");
  auto r = std::make_unique<MpiRequest>(name_, comm_s_, false);
  if (size_ == 1) return r;  // MPI_REQUEST_NULL completes at once
  check(MPI_Iallreduce(MPI_IN_PLACE, data, count_of(n, name_), MPI_FLOAT, MPI_SUM, comm_, r->get()),
        "iallreduce", name_);
  return r;
}

}  // namespace pipetrain
