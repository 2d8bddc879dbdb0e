// StagedCommunicator (comm.p2p = "mpi" on GPUs) on a stand-in device: host memory that
// claims to be cuda:0, with counted copies, and a stream on cuda:0 whose synchronize is
// counted. Every collective and transfer gives the host communicator's values; data sent
// is copied out after the stream's earlier work; data received reaches the device tensor
// only when its request completes; tensors of another device are refused, naming both.
// DeviceComms on that device: expert parallelism's groups, their ranks sharing the one
// GPU, are host-staged and exchange by all-to-all in any order.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <vector>

#include "mpi/communicator_checks.hpp"
#include "pipetrain/comm/mpi_communicator.hpp"
#include "pipetrain/comm/staged_communicator.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/topology/device_comms.hpp"

namespace pipetrain {
namespace {

using testing::dup_world;
using testing::expect_collectives_give_their_values;

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
  expect_collectives_give_their_values(comm, *pool, stream);
  double x = 1.0;
  comm.allreduce_sum(&x, 1);  // host scalars go straight to the host communicator
  EXPECT_EQ(x, static_cast<double>(comm.size()));
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

// Expert parallelism on GPUs (DeviceComms): every rank here claims cuda:0 of this node, so
// the ep, ep-backward and expert-dp groups are host-staged like dp, their exchanges are not
// in stream order (F&B pairs may overlap them), and each gives the host communicator's
// values, the all-to-all included. Without ep there are no expert groups.
TEST_F(StagedFixture, ExpertGroupsOfRanksSharingAGpuAreHostStaged) {
  if (comm.size() % 2 != 0) GTEST_SKIP() << "needs an even number of ranks for ep = 2";
  GridShape p;
  p.dp = comm.size(), p.ep = 2;
  Grid grid(MPI_COMM_WORLD, p);
  DeviceComms comms(grid, gpu, "mpi", 0, 0);
  ASSERT_NE(comms.ep(), nullptr);
  ASSERT_NE(comms.ep_backward(), nullptr);
  ASSERT_NE(comms.expert_dp(), nullptr);
  EXPECT_EQ(comms.ep()->size(), 2);
  EXPECT_EQ(comms.expert_dp()->size(), comm.size() / 2);
  EXPECT_FALSE(comms.ep_in_order());
  EXPECT_NE(comms.summary().find("ep mpi (host-staged)"), std::string::npos) << comms.summary();
  for (Communicator* c : {comms.ep(), comms.ep_backward(), comms.expert_dp()})
    expect_collectives_give_their_values(*c, *pool, stream);
  p.ep = 1;
  Grid dense(MPI_COMM_WORLD, p);
  DeviceComms without(dense, gpu, "mpi", 0, 0);
  EXPECT_EQ(without.ep(), nullptr);
  EXPECT_EQ(without.expert_dp(), nullptr);
}

}  // namespace
}  // namespace pipetrain
