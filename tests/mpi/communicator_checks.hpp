// The values every Communicator gives on host-addressable memory, checked the same way
// for each implementation (MpiCommunicator in test_comm.cpp, StagedCommunicator over a
// stand-in device in test_staged_communicator.cpp).
#pragma once
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <vector>

#include "pipetrain/comm/communicator.hpp"
#include "pipetrain/core/memory_pool.hpp"
#include "pipetrain/core/tensor.hpp"

namespace pipetrain::testing {

inline MPI_Comm dup_world() {
  MPI_Comm c = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &c);
  return c;
}

// An f32 tensor of n elements whose element i on this rank is value(rank, i).
inline Tensor filled(MemoryPool& pool, const Communicator& comm, int64_t n, float (*value)(int rank, int64_t i)) {
  Tensor t = Tensor::empty(pool, {n});
  for (int64_t i = 0; i < n; ++i) t.f32()[i] = value(comm.rank(), i);
  return t;
}

// All-reduce (sum and max, two in flight, waited for in reverse order), reduce-scatter,
// reduce to the first and last rank, in-place all-gather and an i32 broadcast.
inline void expect_collectives_give_their_values(Communicator& comm, MemoryPool& pool, Stream& s) {
  const int R = comm.size(), me = comm.rank();
  Tensor sum =
      filled(pool, comm, 7, [](int r, int64_t i) { return static_cast<float>(r + 1) * static_cast<float>(i); });
  Tensor mx = filled(pool, comm, 5, [](int r, int64_t i) { return static_cast<float>((r * 3 + i) % 4); });
  // Both in flight at once, waited for in the reverse order.
  auto a = comm.allreduce_sum(sum, s);
  auto b = comm.allreduce_max(mx, s);
  b->wait();
  a->wait();
  for (int64_t i = 0; i < 7; ++i) EXPECT_EQ(sum.f32()[i], static_cast<float>(R * (R + 1) / 2 * i));
  for (int64_t i = 0; i < 5; ++i) {
    float want = 0;
    for (int r = 0; r < R; ++r) want = std::max(want, static_cast<float>((r * 3 + i) % 4));
    EXPECT_EQ(mx.f32()[i], want);
  }
  // Reduce-scatter: block r of the sum of everyone's send.
  Tensor send = filled(pool, comm, 3 * R, [](int r, int64_t i) { return static_cast<float>(r + i); });
  Tensor mine = Tensor::empty(pool, {3});
  comm.reduce_scatter_sum(send, mine, s)->wait();
  for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(mine.f32()[j], static_cast<float>(R * (R - 1) / 2 + R * (me * 3 + j)));
  // Reduce in place to one rank: the root holds the sum, the others keep their data.
  for (int root : {0, R - 1}) {
    Tensor red = filled(pool, comm, 4, [](int r, int64_t i) { return static_cast<float>(r * 10 + i); });
    comm.reduce_sum(red, root, s)->wait();
    for (int64_t i = 0; i < 4; ++i)
      EXPECT_EQ(red.f32()[i], me == root ? static_cast<float>(10 * R * (R - 1) / 2 + R * i)
                                         : static_cast<float>(me * 10 + i));
  }
  // All-gather, in place (this rank's block of recv is its send).
  Tensor all = Tensor::empty(pool, {2 * R});
  all.f32()[2 * me] = static_cast<float>(10 * me);
  all.f32()[2 * me + 1] = static_cast<float>(10 * me + 1);
  comm.all_gather(all.view(2 * me, {2}), all, s)->wait_on(s);
  for (int r = 0; r < R; ++r) {
    EXPECT_EQ(all.f32()[2 * r], static_cast<float>(10 * r));
    EXPECT_EQ(all.f32()[2 * r + 1], static_cast<float>(10 * r + 1));
  }
  // Broadcast of i32 data from the last rank.
  Tensor ids = Tensor::empty(pool, {4}, DType::I32);
  for (int i = 0; i < 4; ++i) ids.i32()[i] = me == R - 1 ? 100 + i : -1;
  comm.broadcast(ids, R - 1, s)->wait();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(ids.i32()[i], 100 + i);
  // All-to-all with per-peer counts: rank r sends p + 1 elements valued 100 r + p to rank p
  // (its own block included), so it receives r + 1 from each rank q, valued 100 q + r.
  std::vector<int64_t> out_n(static_cast<size_t>(R)), in_n(static_cast<size_t>(R), me + 1);
  int64_t out_total = 0;
  for (int p = 0; p < R; ++p) out_total += out_n[static_cast<size_t>(p)] = p + 1;
  Tensor a2a_out = Tensor::empty(pool, {out_total}), a2a_in = Tensor::empty(pool, {int64_t{R} * (me + 1)});
  for (int p = 0, at = 0; p < R; ++p)
    for (int j = 0; j <= p; ++j) a2a_out.f32()[at++] = static_cast<float>(100 * me + p);
  comm.all_to_all_v(a2a_out, out_n, a2a_in, in_n, s)->wait();
  for (int q = 0; q < R; ++q)
    for (int j = 0; j <= me; ++j) EXPECT_EQ(a2a_in.f32()[q * (me + 1) + j], static_cast<float>(100 * q + me));
}

}  // namespace pipetrain::testing
