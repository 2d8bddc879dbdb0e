// open_shared_library, resolve_symbol (shared_library.hpp).
#include "shared_library.hpp"

#include <dlfcn.h>

#include "pipetrain/core/error.hpp"

namespace pipetrain::cuda {

void* open_shared_library(const std::string& soname, const std::string& fallback, const std::string& hint) {
  if (void* h = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  const std::string first = dlerror();
  const bool absolute = !fallback.empty() && fallback.front() == '/';
  if (absolute)
    if (void* h = dlopen(fallback.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  const char* second = absolute ? dlerror() : nullptr;
  fail("the CUDA backend cannot load {}: {} (nor {}: {}); add {} to LD_LIBRARY_PATH", soname, first, fallback,
       second ? second : "not an absolute path", hint);
}

void* resolve_symbol(void* library, const std::string& soname, const char* name, const std::string& older) {
  void* f = dlsym(library, name);
  if (f == nullptr) fail("the CUDA backend: {} has no {} ({}?)", soname, name, older);
  return f;
}

}  // namespace pipetrain::cuda
