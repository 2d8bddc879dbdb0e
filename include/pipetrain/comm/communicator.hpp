// Communicator: the collectives and point-to-point messages the runtime and the parallel
// layers need, on device tensors, enqueued on a stream. MpiCommunicator (host memory)
// lives in mpi_communicator.hpp; an NCCL one (device memory) implements the same interface.
//
// Every operation starts after the work enqueued earlier on its stream and returns a
// request: wait() blocks the host until it is complete, wait_on(stream) makes the work
// enqueued later on `stream` run after it (on a GPU without blocking the host). Reductions
// take f32 tensors — pipetrain reduces in fp32 in every precision — and transfers take any
// dtype. A tensor on another device than the stream, or a dtype the operation does not
// take, is an error naming both.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "pipetrain/core/stream.hpp"
#include "pipetrain/core/tensor.hpp"

namespace pipetrain {

// An operation in flight.
class CommRequest {
 public:
  virtual ~CommRequest() = default;  // never blocks (an unfinished operation is abandoned)
  virtual void wait() = 0;
  virtual bool test() = 0;  // true once complete
  // Orders the work enqueued on `stream` from now on after this operation.
  virtual void wait_on(Stream& stream) = 0;
};

// Throws unless there is one count per rank each way and the tensors hold them.
void check_all_to_all_counts(const std::string& comm, int size, const Tensor& send,
                             const std::vector<int64_t>& send_counts, const Tensor& recv,
                             const std::vector<int64_t>& recv_counts);

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // e.g. "pp" — used in error messages
  // The largest message tag send/recv accept (MPI_TAG_UB; the standard guarantees 32767).
  virtual int tag_ub() const = 0;
  // Seconds this rank spent blocked in communication since the last reset (how much of a
  // step communication costs).
  double comm_seconds() const { return comm_s_; }
  void reset_comm_seconds() { comm_s_ = 0; }
  // The most bytes the transport's own scratch held at once, in the memory that holds the
  // tensors, for this communicator's nonblocking reductions while in flight (outside the
  // pool; the measured peak adds it). 0 where the transport needs no scratch of the
  // message's size there (NCCL; host-staged MPI's scratch is host memory).
  virtual double reduction_scratch_peak_bytes() const { return 0; }

  // In place: every rank's `data` becomes the elementwise sum (max) over the ranks.
  virtual std::unique_ptr<CommRequest> allreduce_sum(const Tensor& data, Stream& stream) = 0;
  virtual std::unique_ptr<CommRequest> allreduce_max(const Tensor& data, Stream& stream) = 0;
  // In place, to one rank: root's `data` becomes the elementwise sum over the ranks; the
  // other ranks' `data` is only read (ZeRO-1's buckets each go to the rank owning them).
  virtual std::unique_ptr<CommRequest> reduce_sum(const Tensor& data, int root, Stream& stream) = 0;
  // recv (n elements) = this rank's block of the sum of every rank's send (size() * n
  // elements, block r for rank r).
  virtual std::unique_ptr<CommRequest> reduce_scatter_sum(const Tensor& send, const Tensor& recv, Stream& stream) = 0;
  // recv (size() * n elements) = every rank's send (n elements), in rank order; send may
  // be this rank's block of recv.
  virtual std::unique_ptr<CommRequest> all_gather(const Tensor& send, const Tensor& recv, Stream& stream) = 0;
  virtual std::unique_ptr<CommRequest> broadcast(const Tensor& data, int root, Stream& stream) = 0;
  // In place to `root` (to every rank with root = -1): the log-sum-exp merge of softmax
  // partials. `data` is (rows, 2 + 2k) f32, each row [m, s, a(k), b(k)]: m a maximum, s a
  // sum of exp(x - m), a a vector weighted by exp(x - m), b a plain vector. Merged:
  // m = max_r m_r, s = sum_r s_r e^(m_r - m), a = sum_r a_r e^(m_r - m), b = sum_r b_r (an m
  // of -inf is an empty partial); combined in rank order, so every run gets the same bits.
  // Where the transport has no user-defined reductions (NCCL), it throws.
  virtual std::unique_ptr<CommRequest> reduce_softmax_partials(const Tensor& data, int root, Stream& stream);
  // All-to-all with per-peer counts (in elements, every side knowing both lists): the
  // send_counts[p] elements at send's running offset go to rank p, and rank p's block lands
  // at recv's running offset, recv_counts[p] long. The default pairs a send and a receive
  // per peer in one group (NCCL's way); MPI uses its own all-to-all.
  virtual std::unique_ptr<CommRequest> all_to_all_v(const Tensor& send, const std::vector<int64_t>& send_counts,
                                                    const Tensor& recv, const std::vector<int64_t>& recv_counts,
                                                    Stream& stream);
  virtual std::unique_ptr<CommRequest> send(const Tensor& data, int peer, int tag, Stream& stream) = 0;
  virtual std::unique_ptr<CommRequest> recv(const Tensor& data, int peer, int tag, Stream& stream) = 0;

  // Transfers issued between group_begin() and group_end() progress together: NCCL's
  // ncclGroupStart/End, which the executor puts around the sends and receives between two
  // computes (program.hpp: validate_in_order). Requests of a group complete once it is
  // launched by group_end. No-ops where messages progress on their own (MPI).
  virtual void group_begin() {}
  virtual void group_end() {}

  // Host scalars (metrics, partial sums of a norm): blocking, in host memory.
  virtual void allreduce_sum(double* data, size_t n) = 0;
  virtual void allreduce_max(double* data, size_t n) = 0;
  virtual void barrier() = 0;

 protected:
  double comm_s_ = 0;
};

}  // namespace pipetrain
