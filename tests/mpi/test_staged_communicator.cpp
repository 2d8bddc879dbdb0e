// StagedCommunicator (comm.p2p = "mpi" on GPUs) on a stand-in device: host memory that
// claims to be cuda:0, with counted copies, and a stream on cuda:0 whose synchronize is
// counted. Every collective and transfer gives the host communicator's values; data sent
// is copied out after the stream's earlier work; data received reaches the device tensor
// only when its request completes; tensors of another device are refused, naming both.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <vector>

#include "pipetrain/comm/mpi_communicator.hpp"
#include "pipetrain/comm/staged_communicator.hpp"
#include "pipetrain/core/error.hpp"

namespace pipetrain {
namespace {

class StandInDevice final : public DeviceAllocator {
 public:
  void* allocate(size_t bytes) override { return memory_.allocate(bytes); }
  void deallocate(void* p, size_t bytes) override { memory_.deallocate(p, bytes); }
  DeviceId device() const override { return {DeviceKind::Cuda, 0}; }
  void to_device(void* dst, const void* src, size_t bytes) override {
    ++copies_in;
    std::memcpy(dst, src, bytes);
  }
  void to_host(void* dst, const void* src, size_t bytes) override {
    ++copies_out;
    std::memcpy(dst, src, bytes);
  }
  int copies_in = 0, copies_out = 0;

 private:
  HostAllocator memory_;
};

class StandInStream final : public Stream {
 public:
  DeviceId device() const override { return {DeviceKind::Cuda, 0}; }
  std::string name() const override { return "stand-in cuda:0"; }
  void synchronize() override { ++syncs; }
  int syncs = 0;
};

MPI_Comm dup_world() {
  MPI_Comm c = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &c);
  return c;
}

struct StagedFixture : ::testing::Test {
  StandInDevice gpu;
  StandInStream stream;
  std::shared_ptr<MemoryPool> pool = MemoryPool::create(gpu);
  MpiCommunicator host{dup_world(), "pp"};
  StagedCommunicator comm{host, gpu};
  Tensor filled(int64_t n, float (*value)(int rank, int64_t i), DType dtype = DType::F32) {
    Tensor t = Tensor::empty(*pool, {n}, dtype);
    for (int64_t i = 0; i < n; ++i) {
      const float v = value(comm.rank(), i);
      if (dtype == DType::BF16)
        t.bf16_data()[i] = to_bf16(v);
      else
        t.f32()[i] = v;
    }
    return t;
  }
};

TEST_F(StagedFixture, CollectivesGiveTheHostCommunicatorsValues) {
  const int R = comm.size(), me = comm.rank();
  Tensor sum = filled(7, [](int r, int64_t i) { return static_cast<float>(r + 1) * static_cast<float>(i); });
  Tensor mx = filled(5, [](int r, int64_t i) { return static_cast<float>((r * 3 + i) % 4); });
  auto a = comm.allreduce_sum(sum, stream);
  auto b = comm.allreduce_max(mx, stream);
  b->wait();
  a->wait();
  for (int64_t i = 0; i < 7; ++i) EXPECT_EQ(sum.f32()[i], static_cast<float>(R * (R + 1) / 2 * i));
  for (int64_t i = 0; i < 5; ++i) {
    float want = 0;
    for (int r = 0; r < R; ++r) want = std::max(want, static_cast<float>((r * 3 + i) % 4));
    EXPECT_EQ(mx.f32()[i], want);
  }
  Tensor send = filled(3 * R, [](int r, int64_t i) { return static_cast<float>(r + i); });
  Tensor mine = Tensor::empty(*pool, {3});
  comm.reduce_scatter_sum(send, mine, stream)->wait();
  for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(mine.f32()[j], static_cast<float>(R * (R - 1) / 2 + R * (me * 3 + j)));
  // Reduce in place to one rank: the root holds the sum, the others keep their data.
  for (int root : {0, R - 1}) {
    Tensor red = filled(4, [](int r, int64_t i) { return static_cast<float>(r * 10 + i); });
    comm.reduce_sum(red, root, stream)->wait();
    for (int64_t i = 0; i < 4; ++i)
      EXPECT_EQ(red.f32()[i], me == root ? static_cast<float>(10 * R * (R - 1) / 2 + R * i)
                                         : static_cast<float>(me * 10 + i));
  }
  // All-gather in place: this rank's block of recv is its send.
  Tensor all = Tensor::empty(*pool, {2 * R});
  all.f32()[2 * me] = static_cast<float>(10 * me);
  all.f32()[2 * me + 1] = static_cast<float>(10 * me + 1);
  comm.all_gather(all.view(2 * me, {2}), all, stream)->wait_on(stream);
  for (int r = 0; r < R; ++r) {
    EXPECT_EQ(all.f32()[2 * r], static_cast<float>(10 * r));
    EXPECT_EQ(all.f32()[2 * r + 1], static_cast<float>(10 * r + 1));
  }
  Tensor ids = Tensor::empty(*pool, {4}, DType::I32);
  for (int i = 0; i < 4; ++i) ids.i32()[i] = me == R - 1 ? 100 + i : -1;
  comm.broadcast(ids, R - 1, stream)->wait();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(ids.i32()[i], 100 + i);
  double x = 1.0;
  comm.allreduce_sum(&x, 1);  // host scalars go straight to the host communicator
  EXPECT_EQ(x, static_cast<double>(R));
}

TEST_F(StagedFixture, TransfersCopyOutAfterTheStreamAndLandOnlyWhenComplete) {
  if (comm.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const int next = (comm.rank() + 1) % comm.size(), prev = (comm.rank() + comm.size() - 1) % comm.size();
  Tensor out = filled(64, [](int r, int64_t i) { return static_cast<float>(r) + 0.0078125f * static_cast<float>(i); },
                      DType::BF16);
  Tensor in = Tensor::empty(*pool, {64}, DType::BF16);
  for (int i = 0; i < 64; ++i) in.bf16_data()[i].bits = 0xFFFF;
  auto r = comm.recv(in, prev, 7, stream);
  EXPECT_EQ(gpu.copies_out, 0) << "a receive copies nothing out";
  const int syncs = stream.syncs;
  auto w = comm.send(out, next, 7, stream);
  EXPECT_EQ(stream.syncs, syncs + 1) << "a send waits for the stream's earlier work";
  EXPECT_EQ(gpu.copies_out, 1);
  for (int i = 0; i < 64; ++i) out.bf16_data()[i].bits = 0;  // the message was copied out: reusing it is safe
  comm.barrier();  // every message has been sent: the host buffer holds it, the device tensor not yet
  EXPECT_EQ(in.bf16_data()[0].bits, 0xFFFF);
  r->wait();
  w->wait();
  EXPECT_EQ(gpu.copies_in, 1);
  for (int i = 0; i < 64; ++i)
    EXPECT_EQ(in.bf16_data()[i].bits, to_bf16(static_cast<float>(prev) + 0.0078125f * static_cast<float>(i)).bits);
  r->wait();  // waiting again lands nothing twice
  EXPECT_EQ(gpu.copies_in, 1);
}

TEST_F(StagedFixture, TensorsOfAnotherDeviceAreRefused) {
  HostAllocator host_memory;
  auto host_pool = MemoryPool::create(host_memory);
  const Tensor t = Tensor::empty(*host_pool, {8});
  try {
    comm.allreduce_sum(t, stream);
    ADD_FAILURE() << "a host tensor was accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "all-reduce on the pp communicator (host-staged, cuda:0 memory): data is (8) f32 on host and the "
                 "stream is on cuda:0");
  }
  const Tensor d = Tensor::empty(*pool, {8});
  EXPECT_THROW(comm.send(d, 0, 1, host_stream()), Error);
  // Reductions are f32 only, as on every communicator (the host one says so).
  EXPECT_THROW(comm.allreduce_sum(Tensor::empty(*pool, {8}, DType::BF16), stream), Error);
}

}  // namespace
}  // namespace pipetrain
