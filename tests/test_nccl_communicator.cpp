// The NCCL communicator's build: present exactly when the build says it links NCCL, and
// refusing, with the reason, where it is absent. Its collectives, and a rank's group of
// a send to and a receive from itself, run on a GPU machine (scripts/gpu-check.sh); here a
// GPU-less rank checks what it can.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "pipetrain/backend/cuda.hpp"
#include "pipetrain/comm/nccl_communicator.hpp"
#include "pipetrain/core/error.hpp"

namespace pipetrain {
namespace {

TEST(NcclCommunicator, AvailableExactlyWhenBuiltWithNccl) {
  std::string why;
#ifdef PIPETRAIN_HAVE_NCCL
  EXPECT_TRUE(nccl_available(&why));
  EXPECT_NE(nccl_build_summary().find('.'), std::string::npos) << nccl_build_summary();
#else
  EXPECT_FALSE(nccl_available(&why));
  EXPECT_NE(why.find("without NCCL"), std::string::npos) << why;
  EXPECT_EQ(nccl_build_summary(), "not built");
  EXPECT_THROW(make_nccl_communicator(MPI_COMM_SELF, "tp", 0), Error);
#endif
}

// One rank's NCCL group on GPU 0 (skipped, with the reason, without NCCL or a GPU).
class OneRankNccl : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!nccl_available(&why) || !cuda_available(&why)) GTEST_SKIP() << why;
    MPI_Comm self = MPI_COMM_NULL;
    MPI_Comm_dup(MPI_COMM_SELF, &self);
    be = make_cuda_backend(0);
    pool = MemoryPool::create(*be);
    comm = make_nccl_communicator(self, "test", be->device().index);
  }
  std::unique_ptr<Backend> be;
  std::shared_ptr<MemoryPool> pool;
  std::unique_ptr<Communicator> comm;
};

TEST_F(OneRankNccl, AllReduceOnTheGpu) {
  const Tensor t = Tensor::empty(*pool, {5});
  const float host[5] = {1, 2, 3, 4, 5};
  be->to_device(t.raw(), host, sizeof host);
  comm->allreduce_sum(t, be->stream())->wait_on(be->stream());
  float back[5] = {};
  be->to_host(back, t.raw(), sizeof back);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(back[i], host[i]);
  // Host tensors are refused, naming both devices.
  auto cpu = make_cpu_backend();
  auto host_pool = MemoryPool::create(*cpu);
  EXPECT_THROW(comm->allreduce_sum(Tensor::empty(*host_pool, {5}), be->stream()), Error);
}

// A rank's send to and receive from itself, launched as one group (as the pipeline's
// transfers are): the requests complete once the group is launched, through the real event
// and error-polling logic (wait, then test).
TEST_F(OneRankNccl, SendsToItselfInAGroup) {
  const Tensor out = Tensor::empty(*pool, {7}), in = Tensor::empty(*pool, {7});
  const float host[7] = {1, -2, 3, -4, 5, -6, 7};
  be->to_device(out.raw(), host, sizeof host);
  comm->group_begin();
  auto sent = comm->send(out, 0, 0, be->stream());
  auto received = comm->recv(in, 0, 0, be->stream());
  EXPECT_FALSE(received->test());  // inside the open group: not launched yet
  comm->group_end();
  received->wait();
  EXPECT_TRUE(sent->test());
  float back[7] = {};
  be->to_host(back, in.raw(), sizeof back);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(back[i], host[i]);
}

// The expert exchange's all-to-all (Communicator::all_to_all_v over NCCL's grouped sends and
// receives) on a group of one: the counts' i32 and the rows' f32 come back as sent.
TEST_F(OneRankNccl, AllToAllOfCountsAndRows) {
  const int32_t counts[3] = {4, 0, 7};
  const float rows[6] = {0.5f, -1, 2, -3, 4, -5.5f};
  const Tensor c_out = Tensor::empty(*pool, {3}, DType::I32), c_in = Tensor::empty(*pool, {3}, DType::I32);
  const Tensor r_out = Tensor::empty(*pool, {6}), r_in = Tensor::empty(*pool, {8});
  be->to_device(c_out.raw(), counts, sizeof counts);
  be->to_device(r_out.raw(), rows, sizeof rows);
  comm->all_to_all_v(c_out, {3}, c_in, {3}, be->stream())->wait();
  comm->all_to_all_v(r_out, {6}, r_in, {6}, be->stream())->wait();
  int32_t c_back[3] = {};
  float r_back[6] = {};
  be->to_host(c_back, c_in.raw(), sizeof c_back);
  be->to_host(r_back, r_in.raw(), sizeof r_back);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(c_back[i], counts[i]);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(r_back[i], rows[i]);
  EXPECT_THROW(comm->all_to_all_v(r_out, {6}, r_in, {9}, be->stream()), Error);  // more than r_in holds
}

}  // namespace
}  // namespace pipetrain
