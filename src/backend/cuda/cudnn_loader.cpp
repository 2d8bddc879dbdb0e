// cudnn() (cudnn_loader.hpp).
#include "cudnn_loader.hpp"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <string>

#include "shared_library.hpp"

namespace pipetrain::cuda {

namespace {

#define PIPETRAIN_CUDNN_STR2(x) #x
#define PIPETRAIN_CUDNN_STR(x) PIPETRAIN_CUDNN_STR2(x)
// The major version the headers describe: libcudnn.so.9 for cuDNN 9.
constexpr const char* kSoname = "libcudnn.so." PIPETRAIN_CUDNN_STR(CUDNN_MAJOR);
#undef PIPETRAIN_CUDNN_STR
#undef PIPETRAIN_CUDNN_STR2

// The directory the CUDA runtime was loaded from (the toolkit's library directory, where its
// cuDNN usually sits too), with a trailing '/'; empty when the loader cannot say.
std::string runtime_directory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&cudaRuntimeGetVersion), &info) == 0 || info.dli_fname == nullptr) return {};
  const std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
}

// The soname through the loader's search path, then the copy next to the CUDA runtime (its
// RUNPATH, $ORIGIN, then finds the sub-libraries beside it).
CudnnApi load() {
  CudnnApi api;
  void* library = open_shared_library(kSoname, runtime_directory() + kSoname, "cuDNN's lib directory");
#define PIPETRAIN_RESOLVE_CUDNN(name) \
  resolve_function(library, kSoname, #name, "a cuDNN older than the headers built against", api.name);
  PIPETRAIN_CUDNN_FUNCTIONS(PIPETRAIN_RESOLVE_CUDNN)
#undef PIPETRAIN_RESOLVE_CUDNN
  return api;  // the library stays open for the process's life
}

}  // namespace

const CudnnApi& cudnn() {
  static const CudnnApi api = load();  // once; a failure throws again on the next call
  return api;
}

}  // namespace pipetrain::cuda
