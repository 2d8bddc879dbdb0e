// cudnn() (cudnn_loader.hpp).
#include "cudnn_loader.hpp"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <string>

#include "pipetrain/core/error.hpp"

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
void* open_library() {
  if (void* h = dlopen(kSoname, RTLD_NOW | RTLD_LOCAL)) return h;
  const std::string first = dlerror();
  const std::string beside = runtime_directory() + kSoname;
  if (beside.front() == '/')
    if (void* h = dlopen(beside.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  const char* second = dlerror();
  fail("the CUDA backend cannot load {}: {} (nor {}: {}); add cuDNN's lib directory to LD_LIBRARY_PATH", kSoname, first,
       beside, second != nullptr ? second : "not an absolute path");
}

template <typename F>
void resolve(void* library, const char* name, F& out) {
  out = reinterpret_cast<F>(dlsym(library, name));
  if (out == nullptr)
    fail("the CUDA backend: {} has no {} (a cuDNN older than the headers built against?)", kSoname, name);
}

CudnnApi load() {
  CudnnApi api;
  void* library = open_library();
#define PIPETRAIN_RESOLVE_CUDNN(name) resolve(library, #name, api.name);
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
