// cublas() (cublas_loader.hpp).
#include "cublas_loader.hpp"

#include <dlfcn.h>

#include "shared_library.hpp"

namespace pipetrain::cuda {

namespace {

constexpr const char* kHint = "the CUDA toolkit's lib directory";
constexpr const char* kOlder = "a cuBLAS older than the toolkit built against";

// The soname the toolkit was built with ("libcublas.so.13"), then the toolkit's own copy
// (the build's library directory) where the loader's search path does not reach it.
CublasApi load() {
  CublasApi api;
  void* lt = open_shared_library(PIPETRAIN_CUBLASLT_SONAME, PIPETRAIN_CUBLASLT_PATH, kHint);
  void* blas = open_shared_library(PIPETRAIN_CUBLAS_SONAME, PIPETRAIN_CUBLAS_PATH, kHint);
#define PIPETRAIN_RESOLVE_BLAS(name) resolve_function(blas, PIPETRAIN_CUBLAS_SONAME, #name, kOlder, api.name);
#define PIPETRAIN_RESOLVE_LT(name) resolve_function(lt, PIPETRAIN_CUBLASLT_SONAME, #name, kOlder, api.name);
  PIPETRAIN_CUBLAS_FUNCTIONS(PIPETRAIN_RESOLVE_BLAS)
#define PIPETRAIN_RESOLVE_OPTIONAL(name) api.name = reinterpret_cast<decltype(api.name)>(dlsym(blas, #name));
  PIPETRAIN_CUBLAS_OPTIONAL_FUNCTIONS(PIPETRAIN_RESOLVE_OPTIONAL)
#undef PIPETRAIN_RESOLVE_OPTIONAL
  PIPETRAIN_CUBLASLT_FUNCTIONS(PIPETRAIN_RESOLVE_LT)
#undef PIPETRAIN_RESOLVE_BLAS
#undef PIPETRAIN_RESOLVE_LT
  return api;  // the libraries stay open for the process's life
}

}  // namespace

const CublasApi& cublas() {
  static const CublasApi api = load();  // once; a failure throws again on the next call
  return api;
}

}  // namespace pipetrain::cuda
