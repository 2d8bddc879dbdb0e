// Which ranks would share a GPU (NCCL refuses them), decided by each GPU's identity with
// stand-in devices: ranks that each see their own GPU as device 0 (the shipped Slurm
// scripts' --gpu-bind=closest, or CUDA_VISIBLE_DEVICES per rank) share none.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pipetrain/topology/device_comms.hpp"

namespace pipetrain {
namespace {

class StandInGpu final : public DeviceAllocator {
 public:
  StandInGpu(int ordinal, std::string uuid) : ordinal_(ordinal), uuid_(std::move(uuid)) {}
  void* allocate(size_t) override { return nullptr; }
  void deallocate(void*, size_t) override {}
  DeviceId device() const override { return {DeviceKind::Cuda, ordinal_}; }
  std::string hardware_id() const override { return uuid_; }

 private:
  int ordinal_;
  std::string uuid_;
};

std::vector<std::string> identities(const std::vector<StandInGpu>& ranks) {
  std::vector<std::string> out;
  for (const auto& r : ranks) out.push_back(gpu_identity(r));
  return out;
}

TEST(GpuIdentity, EachRanksDeviceZeroIsItsOwnGpu) {
  const std::vector<StandInGpu> ranks = {{0, "GPU-0a"}, {0, "GPU-1b"}, {0, "GPU-2c"}, {0, "GPU-3d"}};
  EXPECT_FALSE(ranks_sharing_a_gpu(identities(ranks)));
}

TEST(GpuIdentity, TwoRanksOnOneGpuAreFound) {
  // One GPU seen as device 1 by one rank and as device 0 by another (different visible sets).
  const std::vector<StandInGpu> ranks = {{0, "GPU-0a"}, {1, "GPU-1b"}, {0, "GPU-1b"}};
  const auto shared = ranks_sharing_a_gpu(identities(ranks));
  ASSERT_TRUE(shared);
  EXPECT_EQ(shared->first, 1);
  EXPECT_EQ(shared->second, 2);
}

TEST(GpuIdentity, WithoutAUuidTheNodeAndOrdinalDecide) {
  const std::vector<StandInGpu> ranks = {{0, ""}, {1, ""}, {1, ""}};
  const std::vector<std::string> ids = identities(ranks);
  EXPECT_NE(ids[0].find(":cuda:0"), std::string::npos) << ids[0];
  const auto shared = ranks_sharing_a_gpu(ids);
  ASSERT_TRUE(shared);
  EXPECT_EQ(shared->first, 1);
}

}  // namespace
}  // namespace pipetrain
