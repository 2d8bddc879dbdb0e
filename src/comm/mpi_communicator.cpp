#include "pipetrain/comm/mpi_communicator.hpp"

#include <climits>
#include <mutex>
#include <vector>

#include "pipetrain/comm/mpi_tool_vars.hpp"
#include "pipetrain/comm/softmax_partials.hpp"
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
    release_scratch();  // freed by MPI at completion, or abandoned with the request
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
    release_scratch();
  }
  bool test() override {
    int done = 0;
    check(MPI_Test(&req_, &done, MPI_STATUS_IGNORE), "test", comm_);
    if (done) release_scratch();
    return done != 0;
  }
  // The library's scratch for this operation, held until its completion is observed.
  void hold_scratch(std::shared_ptr<MpiCommunicator::ScratchMeter> meter, int64_t bytes) {
    meter_ = std::move(meter);
    scratch_ = bytes;
    meter_->add(bytes);
  }
  void wait_on(Stream& /*host stream*/) override { wait(); }  // the host stream runs what follows now
  MPI_Request* get() { return &req_; }
  std::vector<int>& arrays() { return arrays_; }  // what MPI reads until completion (counts)
  void describe(std::string what) { what_ = std::move(what); }

 private:
  void release_scratch() {
    if (meter_) meter_->release(scratch_);
    meter_.reset();
  }
  std::vector<int> arrays_;
  std::shared_ptr<MpiCommunicator::ScratchMeter> meter_;
  int64_t scratch_ = 0;
  MPI_Request req_ = MPI_REQUEST_NULL;
  std::string comm_;
  double& timer_;
  bool receive_;
  std::string what_;
};

// MPI's datatype for a dtype's elements (bf16 travels as 16-bit words; it is never reduced).
MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::BF16: return MPI_UINT16_T;
    case DType::I32: return MPI_INT;
  }
  return MPI_BYTE;
}

// MPI moves host memory, in the order of the host stream.
void check_host(const char* op, const std::string& comm, const Tensor& t, const char* name, Stream& stream) {
  if (t.device().kind != DeviceKind::Host || stream.device().kind != DeviceKind::Host)
    fail("{} on the {} communicator (MPI, host memory): {} is {} and the stream is on {}", op, comm, name,
         t.describe(), stream.device().str());
}

// Open MPI's nonblocking collectives (libnbc) pick poor algorithms for the dp buckets
// (large, in place), so two are chosen through MPI_T before this process's first
// reduction, each unless the user set it (other MPIs lack the variables):
// - reduce: libnbc takes a segmented chain for large messages, and a chain advances one
//   segment per progress call: a 25 MiB bucket left 0.46 s of 2 s of overlapped compute
//   still to do at the wait (2 ranks), against 0 with the binomial tree (one message).
// - all-reduce: libnbc takes the binomial tree for every in-place call, which moves the
//   whole message through the root twice; Rabenseifner's reduce-scatter + all-gather moves
//   2(p-1)/p of it per rank (libnbc falls back to its ring below 2^floor(log2 p) elements).
//   20 in-place 25 MiB all-reduces, 2 ranks: 0.27-0.29 s binomial, 0.15-0.16 s.
// Both reduce each element once and send the result on, so every rank gets the same bits.
void tune_libnbc_algorithms() {
  static std::once_flag once;
  std::call_once(once, [] {
    choose_mpi_tool_int("coll_libnbc_ireduce_algorithm", 2);     // binomial
    choose_mpi_tool_int("coll_libnbc_iallreduce_algorithm", 3);  // Rabenseifner
  });
}

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

void MpiCommunicator::ScratchMeter::add(int64_t bytes) {
  const int64_t held = now += bytes;
  for (int64_t p = peak.load(); held > p && !peak.compare_exchange_weak(p, held);) {
  }
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_SELF && comm_ != MPI_COMM_NULL)
    MPI_Comm_free(&comm_);
}

std::unique_ptr<CommRequest> MpiCommunicator::iallreduce(const Tensor& data, Stream& stream, MPI_Op op,
                                                         const char* what) {
  fault::point("collective");
  check_host(what, name_, data, "data", stream);
  check_dtype(what, "data", data, DType::F32);
  auto r = std::make_unique<MpiRequest>(name_, comm_s_, false);
  r->describe(fmt::format("an {} on the {} communicator", what, name_));
  if (size_ == 1) return r;  // MPI_REQUEST_NULL completes at once
  tune_libnbc_algorithms();
  check(MPI_Iallreduce(MPI_IN_PLACE, data.raw(), count_of(static_cast<size_t>(data.numel()), name_), MPI_FLOAT, op,
                       comm_, r->get()),
        what, name_);
  r->hold_scratch(scratch_, static_cast<int64_t>(data.bytes()));
  return r;
}

std::unique_ptr<CommRequest> MpiCommunicator::allreduce_sum(const Tensor& data, Stream& stream) {
  return iallreduce(data, stream, MPI_SUM, "all-reduce");
}

std::unique_ptr<CommRequest> MpiCommunicator::allreduce_max(const Tensor& data, Stream& stream) {
  return iallreduce(data, stream, MPI_MAX, "all-reduce (max)");
}

std::unique_ptr<CommRequest> MpiCommunicator::reduce_sum(const Tensor& data, int root, Stream& stream) {
  fault::point("collective");
  check_host("reduce", name_, data, "data", stream);
  check_dtype("reduce", "data", data, DType::F32);
  if (root < 0 || root >= size_) fail("reduce on the {} communicator: root {} of {} ranks", name_, root, size_);
  auto r = std::make_unique<MpiRequest>(name_, comm_s_, false);
  r->describe(fmt::format("a reduce to rank {} on the {} communicator", root, name_));
  if (size_ == 1) return r;
  tune_libnbc_algorithms();
  const bool me = rank_ == root;  // the root's data is both input and result; elsewhere only read
  check(MPI_Ireduce(me ? MPI_IN_PLACE : data.raw(), me ? data.raw() : nullptr,
                    count_of(static_cast<size_t>(data.numel()), name_), MPI_FLOAT, MPI_SUM, root, comm_, r->get()),
        "reduce", name_);
  r->hold_scratch(scratch_, static_cast<int64_t>(data.bytes()) * (me ? 1 : 2));
  return r;
}

namespace {

// MPI's user operation over rows of softmax partials: the row width from the datatype (a
// contiguous run of floats), so one operation serves every width.
void merge_softmax_rows(void* in, void* inout, int* len, MPI_Datatype* type) {
  int bytes = 0;
  MPI_Type_size(*type, &bytes);
  const int k = (bytes / static_cast<int>(sizeof(float)) - 2) / 2;
  merge_softmax_partials(static_cast<const float*>(in), static_cast<float*>(inout), *len, k);
}

MPI_Op softmax_merge_op() {
  static MPI_Op op = [] {
    MPI_Op o = MPI_OP_NULL;
    MPI_Op_create(&merge_softmax_rows, /*commute=*/0, &o);  // rank order: the same bits every run
    return o;
  }();
  return op;
}

}  // namespace

std::unique_ptr<CommRequest> MpiCommunicator::reduce_softmax_partials(const Tensor& data, int root, Stream& stream) {
  fault::point("collective");
  const char* what = "reduce (softmax partials)";
  check_host(what, name_, data, "data", stream);
  check_dtype(what, "data", data, DType::F32);
  if (data.shape().size() != 2 || data.shape()[1] < 2 || data.shape()[1] % 2 != 0)
    fail("{} on the {} communicator: data is {}, not rows of [m, s, a(k), b(k)]", what, name_, data.describe());
  if (root < -1 || root >= size_) fail("{} on the {} communicator: root {} of {} ranks", what, name_, root, size_);
  auto r = std::make_unique<MpiRequest>(name_, comm_s_, false);
  r->describe(fmt::format("a {} to {} on the {} communicator", what, root < 0 ? "every rank" : fmt::format("rank {}", root), name_));
  if (size_ == 1) return r;
  MPI_Datatype row = MPI_DATATYPE_NULL;
  check(MPI_Type_contiguous(static_cast<int>(data.shape()[1]), MPI_FLOAT, &row), what, name_);
  check(MPI_Type_commit(&row), what, name_);
  const int rows = count_of(static_cast<size_t>(data.shape()[0]), name_);
  const bool in_place = root < 0 || rank_ == root;  // elsewhere only read
  const int rc = root < 0 ? MPI_Iallreduce(MPI_IN_PLACE, data.raw(), rows, row, softmax_merge_op(), comm_, r->get())
                          : MPI_Ireduce(in_place ? MPI_IN_PLACE : data.raw(), in_place ? data.raw() : nullptr, rows, row,
                                        softmax_merge_op(), root, comm_, r->get());
  MPI_Type_free(&row);  // the posted reduction keeps its own reference
  check(rc, what, name_);
  return r;
}

std::unique_ptr<CommRequest> MpiCommunicator::reduce_scatter_sum(const Tensor& send, const Tensor& recv,
                                                                 Stream& stream) {
  fault::point("collective");
  check_host("reduce-scatter", name_, send, "send", stream);
  check_host("reduce-scatter", name_, recv, "recv", stream);
  check_dtype("reduce-scatter", "send", send, DType::F32);
  check_dtype("reduce-scatter", "recv", recv, DType::F32);
  if (send.numel() != recv.numel() * size_)
    fail("reduce-scatter on the {} communicator: send has {} elements, recv {} ({} ranks)", name_, send.numel(),
         recv.numel(), size_);
  auto r = std::make_unique<MpiRequest>(name_, comm_s_, false);
  r->describe(fmt::format("a reduce-scatter on the {} communicator", name_));
  check(MPI_Ireduce_scatter_block(send.raw(), recv.raw(), count_of(static_cast<size_t>(recv.numel()), name_),
                                  MPI_FLOAT, MPI_SUM, comm_, r->get()),
        "reduce-scatter", name_);
  // libnbc's: two buffers of the whole message on every rank, until completion.
  if (size_ > 1) r->hold_scratch(scratch_, 2 * static_cast<int64_t>(send.bytes()));
  return r;
}

std::unique_ptr<CommRequest> MpiCommunicator::all_gather(const Tensor& send, const Tensor& recv, Stream& stream) {
  fault::point("collective");
  check_host("all-gather", name_, send, "send", stream);
  check_host("all-gather", name_, recv, "recv", stream);
  check_same_kind("all-gather", "send", send, "recv", recv);
  if (recv.numel() != send.numel() * size_)
    fail("all-gather on the {} communicator: send has {} elements, recv {} ({} ranks)", name_, send.numel(),
         recv.numel(), size_);
  const int n = count_of(static_cast<size_t>(send.numel()), name_);
  const MPI_Datatype type = mpi_type(send.dtype());
  // A rank's own block already in place in recv: MPI_IN_PLACE.
  const char* own = static_cast<const char*>(recv.raw()) + static_cast<size_t>(rank_) * send.bytes();
  const void* s = send.raw() == own ? MPI_IN_PLACE : send.raw();
  auto r = std::make_unique<MpiRequest>(name_, comm_s_, false);
  r->describe(fmt::format("an all-gather on the {} communicator", name_));
  check(MPI_Iallgather(s, n, type, recv.raw(), n, type, comm_, r->get()), "all-gather", name_);
  return r;
}

std::unique_ptr<CommRequest> MpiCommunicator::broadcast(const Tensor& data, int root, Stream& stream) {
  fault::point("collective");
  check_host("broadcast", name_, data, "data", stream);
  auto r = std::make_unique<MpiRequest>(name_, comm_s_, false);
  r->describe(fmt::format("a broadcast from rank {} on the {} communicator", root, name_));
  if (size_ == 1) return r;
  check(MPI_Ibcast(data.raw(), count_of(static_cast<size_t>(data.numel()), name_), mpi_type(data.dtype()), root,
                   comm_, r->get()),
        "broadcast", name_);
  return r;
}

std::unique_ptr<CommRequest> MpiCommunicator::all_to_all_v(const Tensor& send, const std::vector<int64_t>& send_counts,
                                                           const Tensor& recv, const std::vector<int64_t>& recv_counts,
                                                           Stream& stream) {
  fault::point("collective");
  check_host("all-to-all", name_, send, "send", stream);
  check_host("all-to-all", name_, recv, "recv", stream);
  check_same_kind("all-to-all", "send", send, "recv", recv);
  check_all_to_all_counts(name_, size_, send, send_counts, recv, recv_counts);
  auto r = std::make_unique<MpiRequest>(name_, comm_s_, false);  // a collective: never cancelled
  r->describe(fmt::format("an all-to-all on the {} communicator", name_));
  // counts and displacements, sent then received, in one array MPI reads until completion
  std::vector<int>& a = r->arrays();
  a.resize(4 * static_cast<size_t>(size_));
  const auto n = static_cast<size_t>(size_);
  size_t out = 0, in = 0;
  for (size_t p = 0; p < n; ++p) {
    a[p] = count_of(static_cast<size_t>(send_counts[p]), name_);
    a[n + p] = count_of(out, name_);
    a[2 * n + p] = count_of(static_cast<size_t>(recv_counts[p]), name_);
    a[3 * n + p] = count_of(in, name_);
    out += static_cast<size_t>(send_counts[p]);
    in += static_cast<size_t>(recv_counts[p]);
  }
  const MPI_Datatype type = mpi_type(send.dtype());
  check(MPI_Ialltoallv(send.raw(), a.data(), a.data() + n, type, recv.raw(), a.data() + 2 * n, a.data() + 3 * n, type,
                       comm_, r->get()),
        "all-to-all", name_);
  return r;
}

std::unique_ptr<CommRequest> MpiCommunicator::send(const Tensor& data, int peer, int tag, Stream& stream) {
  check_host("send", name_, data, "data", stream);
  auto r = std::make_unique<MpiRequest>(name_, comm_s_, false);
  r->describe(fmt::format("the send of message {} to rank {} of the {} communicator to complete", tag, peer, name_));
  check(MPI_Isend(data.raw(), count_of(static_cast<size_t>(data.numel()), name_), mpi_type(data.dtype()), peer, tag,
                  comm_, r->get()),
        "isend", name_);
  return r;
}

std::unique_ptr<CommRequest> MpiCommunicator::recv(const Tensor& data, int peer, int tag, Stream& stream) {
  check_host("recv", name_, data, "data", stream);
  auto r = std::make_unique<MpiRequest>(name_, comm_s_, true);
  r->describe(fmt::format("message {} from rank {} of the {} communicator", tag, peer, name_));
  check(MPI_Irecv(data.raw(), count_of(static_cast<size_t>(data.numel()), name_), mpi_type(data.dtype()), peer, tag,
                  comm_, r->get()),
        "irecv", name_);
  return r;
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

void MpiCommunicator::barrier() {
  fault::point("collective");
  check(MPI_Barrier(comm_), "barrier", name_);
}

}  // namespace pipetrain
