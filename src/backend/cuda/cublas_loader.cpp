// cublas() (cublas_loader.hpp).
#include "cublas_loader.hpp"

#include <dlfcn.h>

#include <string>

#include "pipetrain/core/error.hpp"

namespace pipetrain::cuda {

namespace {

// The soname the toolkit was built with ("libcublas.so.13"), then the toolkit's own copy
// (the build's library directory) where the loader's search path does not reach it.
void* open_library(const char* soname, const char* toolkit_path) {
  if (void* h = dlopen(soname, RTLD_NOW | RTLD_LOCAL)) return h;
  const std::string first = dlerror();
  if (void* h = dlopen(toolkit_path, RTLD_NOW | RTLD_LOCAL)) return h;
  fail("the CUDA backend cannot load {}: {} (nor {}: {}); add the CUDA toolkit's lib directory to LD_LIBRARY_PATH",
       soname, first, toolkit_path, dlerror());
}

template <typename F>
void resolve(void* library, const char* soname, const char* name, F& out) {
  out = reinterpret_cast<F>(dlsym(library, name));
  if (out == nullptr)
    fail("the CUDA backend: {} has no {} (a cuBLAS older than the toolkit built against?)", soname, name);
}

CublasApi load() {
  CublasApi api;
  void* lt = open_library(PIPETRAIN_CUBLASLT_SONAME, PIPETRAIN_CUBLASLT_PATH);
  void* blas = open_library(PIPETRAIN_CUBLAS_SONAME, PIPETRAIN_CUBLAS_PATH);
#define PIPETRAIN_RESOLVE_BLAS(name) resolve(blas, PIPETRAIN_CUBLAS_SONAME, #name, api.name);
#define PIPETRAIN_RESOLVE_LT(name) resolve(lt, PIPETRAIN_CUBLASLT_SONAME, #name, api.name);
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
