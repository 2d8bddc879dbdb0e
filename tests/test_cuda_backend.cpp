// The CUDA backend's entry points (include/pipetrain/backend/cuda.hpp) in every
// build: without CUDA, or without a GPU, cuda_available() says why and
// make_cuda_backend() throws an Error carrying that reason; with a GPU, the
// backend comes up on a valid device. The kernels themselves are checked by the
// "cuda" instances of the kernel harness (test_kernels*.cpp), which skip with
// "no GPU: <reason>" on machines without one.
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <string>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/backend/cuda.hpp"
#include "pipetrain/core/error.hpp"
#ifdef PIPETRAIN_HAVE_CUDA
#include "../src/backend/cuda/cublas_loader.hpp"
#include "../src/backend/cuda/shared_library.hpp"
#endif

namespace pipetrain {
namespace {

// cuBLAS is opened when the backend first needs it, not when the process starts (it cost
// every process half a second): absent from this process's mappings until cublas(), which
// then resolves every function, GPU or not. First in the file, so no backend ran before it.
TEST(CudaBackend, CublasOpensOnFirstUse) {
#ifdef PIPETRAIN_HAVE_CUDA
  auto mapped = [] {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line))
      if (line.find("libcublasLt") != std::string::npos) return true;
    return false;
  };
  if (!std::ifstream("/proc/self/maps")) GTEST_SKIP() << "no /proc/self/maps to look at";
  EXPECT_FALSE(mapped()) << "libcublasLt was loaded at start";
  const cuda::CublasApi& api = cuda::cublas();
#define PIPETRAIN_EXPECT_RESOLVED(name) EXPECT_NE(api.name, nullptr) << #name;
  PIPETRAIN_CUBLAS_FUNCTIONS(PIPETRAIN_EXPECT_RESOLVED)
  PIPETRAIN_CUBLASLT_FUNCTIONS(PIPETRAIN_EXPECT_RESOLVED)
#undef PIPETRAIN_EXPECT_RESOLVED
  EXPECT_TRUE(mapped());
  EXPECT_EQ(&cuda::cublas(), &api);  // opened once
#else
  GTEST_SKIP() << "built without CUDA: no cuBLAS to open";
#endif
}

// A library the loaders cannot open, or a function it lacks, is one Error naming it, where
// else it was looked for and why, and what to add to LD_LIBRARY_PATH.
TEST(CudaBackend, LibraryLoadFailuresNameTheLibrary) {
#ifdef PIPETRAIN_HAVE_CUDA
  auto message = [](auto f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string absent = message([] {
    cuda::open_shared_library("libpipetrain-absent.so.1", "/nonexistent/libpipetrain-absent.so.1", "its lib directory");
  });
  for (const char* part : {"cannot load libpipetrain-absent.so.1", "nor /nonexistent/libpipetrain-absent.so.1",
                           "add its lib directory to LD_LIBRARY_PATH"})
    EXPECT_NE(absent.find(part), std::string::npos) << absent;
  void* libc = cuda::open_shared_library("libc.so.6", "", "");
  EXPECT_NE(cuda::resolve_symbol(libc, "libc.so.6", "malloc", "an old libc"), nullptr);
  const std::string missing =
      message([&] { cuda::resolve_symbol(libc, "libc.so.6", "pipetrain_absent_function", "an old libc"); });
  EXPECT_NE(missing.find("libc.so.6 has no pipetrain_absent_function (an old libc?)"), std::string::npos) << missing;
#else
  GTEST_SKIP() << "built without CUDA: no libraries to open";
#endif
}

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
