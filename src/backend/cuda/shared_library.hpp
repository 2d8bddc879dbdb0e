// Opening a CUDA library at first use (cublas_loader, cudnn_loader): dlopen by soname through
// the loader's search path, else by a fallback path, and dlsym of each function the backend
// calls, each failure an Error naming the library and dlerror()'s reason.
// Exports: open_shared_library, resolve_symbol, resolve_function.
#pragma once
#include <string>

namespace pipetrain::cuda {

// `soname`, then `fallback` when it is an absolute path; throws Error naming both, their
// reasons, and `hint` (what to add to LD_LIBRARY_PATH). The library stays open.
void* open_shared_library(const std::string& soname, const std::string& fallback, const std::string& hint);

// The address of `name` in `library`, or Error naming `soname` and `older` (which library
// version would lack it).
void* resolve_symbol(void* library, const std::string& soname, const char* name, const std::string& older);

template <typename F>
void resolve_function(void* library, const std::string& soname, const char* name, const std::string& older, F& out) {
  out = reinterpret_cast<F>(resolve_symbol(library, soname, name, older));
}

}  // namespace pipetrain::cuda
