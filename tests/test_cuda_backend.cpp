// The CUDA backend's entry points (include/pipetrain/backend/cuda.hpp) in every
// build: without CUDA, or without a GPU, cuda_available() says why and
// make_cuda_backend() throws an Error carrying that reason; with a GPU, the
// backend comes up on a valid device. The kernels themselves are checked by the
// "cuda" instances of the kernel harness (test_kernels*.cpp), which skip with
// "no GPU: <reason>" on machines without one.
#include <gtest/gtest.h>

#include <iostream>
#include <string>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/backend/cuda.hpp"
#include "pipetrain/core/error.hpp"

namespace pipetrain {
namespace {

TEST(CudaBackend, BuildSummary) {
  const std::string s = cuda_build_summary();
#ifdef PIPETRAIN_HAVE_CUDA
  EXPECT_EQ(s.rfind("CUDA ", 0), 0u) << s;
  EXPECT_NE(s.find("built for sm_"), std::string::npos) << s;
#else
  EXPECT_EQ(s, "not built");
#endif
}

// Without a usable GPU (or without CUDA in the build) the failure is explained.
TEST(CudaBackend, UnavailableIsExplained) {
  std::string why;
  if (cuda_available(&why)) GTEST_SKIP() << "a GPU is available: nothing to explain";
  std::cout << "[   INFO   ] no GPU: " << why << "\n";
  ASSERT_FALSE(why.empty());
#ifndef PIPETRAIN_HAVE_CUDA
  EXPECT_NE(why.find("-DPIPETRAIN_ENABLE_CUDA=ON"), std::string::npos) << why;
#endif
  try {
    make_cuda_backend();
    ADD_FAILURE() << "make_cuda_backend() did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
}

TEST(CudaBackend, CreatesOnDevice) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  auto be = make_cuda_backend();
  ASSERT_NE(be, nullptr);
  EXPECT_EQ(be->device().kind, DeviceKind::Cuda);
  EXPECT_EQ(be->name().rfind("cuda (", 0), 0u) << be->name();
  auto be0 = make_cuda_backend(0);
  EXPECT_EQ(be0->device().kind, DeviceKind::Cuda);
  EXPECT_THROW(make_cuda_backend(1 << 20), Error);  // no node has a million GPUs
  EXPECT_THROW(make_cuda_backend(-2), Error);
}

}  // namespace
}  // namespace pipetrain
