#include "pipetrain/core/malloc_policy.hpp"

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace pipetrain {

namespace {

std::string& state() {
  static std::string text = "not set up (keep_freed_host_memory was not called)";
  return text;
}

// The user's own malloc setting, if any: the variable that holds it.
const char* user_setting() {
  for (const char* var : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"})
    if (const char* v = std::getenv(var); v && *v) return var;
  if (const char* t = std::getenv("GLIBC_TUNABLES"))
    if (std::strstr(t, "glibc.malloc.mmap_threshold") || std::strstr(t, "glibc.malloc.trim_threshold"))
      return "GLIBC_TUNABLES";
  return nullptr;
}

}  // namespace

void keep_freed_host_memory() {
#if defined(__GLIBC__)
  if (const char* var = user_setting()) {
    state() = fmt::format("glibc, {} set: left as is", var);
    return;
  }
  // Setting the mmap threshold also stops glibc from moving it; -1 turns trimming off.
  const bool ok = mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMallocKeepBelow)) == 1 && mallopt(M_TRIM_THRESHOLD, -1) == 1;
  state() = ok ? fmt::format("glibc, freed blocks below {} MiB kept for reuse (set by pipetrain)", kMallocKeepBelow >> 20)
               : "glibc, mallopt refused: left as is";
#else
  state() = "not glibc's: left as is";
#endif
}

std::string malloc_policy_summary() { return state(); }

}  // namespace pipetrain
