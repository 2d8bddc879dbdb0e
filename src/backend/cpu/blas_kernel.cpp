#include "pipetrain/backend/blas_kernel.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "pipetrain/backend/backend.hpp"

namespace pipetrain {

namespace {

// 0 = SSE-class, 1 = AVX, 2 = AVX2 + FMA, 3 = AVX-512; -1 = not an x86 OpenBLAS core.
int core_level(const std::string& core) {
  std::string c = core;
  std::transform(c.begin(), c.end(), c.begin(), [](unsigned char x) { return static_cast<char>(std::tolower(x)); });
  static const std::vector<std::pair<const char*, int>> levels = {
      {"cooperlake", 3}, {"sapphirerapids", 3}, {"skylakex", 3}, {"haswell", 2}, {"zen", 2},
      {"excavator", 2},  {"sandybridge", 1},    {"bulldozer", 1}, {"piledriver", 1}, {"steamroller", 1},
      {"prescott", 0},   {"core2", 0},          {"penryn", 0},   {"dunnington", 0}, {"nehalem", 0},
      {"atom", 0},       {"opteron", 0},        {"opteron_sse3", 0}, {"barcelona", 0}, {"bobcat", 0},
      {"katmai", 0},     {"coppermine", 0},     {"northwood", 0}, {"banias", 0},    {"athlon", 0},
      {"nano", 0}};
  for (const auto& [name, level] : levels)
    if (c == name) return level;
  return -1;
}

const char* isa_name(const CpuIsa& isa) {
  return isa.avx512 ? "AVX-512" : isa.avx2_fma ? "AVX2" : isa.avx ? "AVX" : "SSE";
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

constexpr const char* kCorrectedFrom = "PIPETRAIN_BLAS_CORRECTED_FROM";

}  // namespace

CpuIsa detect_cpu_isa() {
  CpuIsa isa;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  isa.avx = __builtin_cpu_supports("avx");
  isa.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  isa.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  // GCC 12 has no builtin name for AVX512_BF16: CPUID leaf 7, subleaf 1, EAX bit 5.
  unsigned a = 0, b = 0, c = 0, d = 0;
  __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(1));
  isa.avx512_bf16 = isa.avx512 && (a & (1u << 5)) != 0;
  isa.amd = __builtin_cpu_is("amd");
#endif
  return isa;
}

std::string better_openblas_core(const std::string& running, const CpuIsa& isa) {
  const int have = core_level(running);
  if (have < 0) return "";
  const int can = isa.avx512 ? 3 : isa.avx2_fma ? 2 : isa.avx ? 1 : 0;
  if (have >= can) return "";
  switch (can) {
    case 3: return isa.avx512_bf16 ? "Cooperlake" : "SkylakeX";
    case 2: return isa.amd ? "Zen" : "Haswell";
    default: return "Sandybridge";
  }
}

void select_blas_kernel(char** argv) {
#ifdef PIPETRAIN_HAVE_OPENBLAS
  const std::string policy = env("PIPETRAIN_BLAS_KERNEL");
  if (policy == "keep" || !env(kCorrectedFrom).empty()) return;  // never twice
  if (!env("OPENBLAS_CORETYPE").empty() && policy != "best") return;  // the user's choice
  const std::string running = blas_kernel_name();
  const std::string better = better_openblas_core(running, detect_cpu_isa());
  if (better.empty()) return;
  ::setenv(kCorrectedFrom, running.c_str(), 1);
  ::setenv("OPENBLAS_CORETYPE", better.c_str(), 1);
  ::execv("/proc/self/exe", argv);
  // Could not re-execute (no /proc?): run on, with the slow kernel, and say so.
  std::fprintf(stderr, "pipetrain: warning: OpenBLAS runs its %s kernel on this %s CPU; set OPENBLAS_CORETYPE=%s "
               "for its %s kernel (re-executing failed: %s)\n",
               running.c_str(), isa_name(detect_cpu_isa()), better.c_str(), better.c_str(), std::strerror(errno));
  ::unsetenv(kCorrectedFrom);
  ::unsetenv("OPENBLAS_CORETYPE");
#else
  (void)argv;
#endif
}

std::string blas_kernel_summary() {
  const std::string running = blas_kernel_name();
#ifdef PIPETRAIN_HAVE_OPENBLAS
  if (const std::string from = env(kCorrectedFrom); !from.empty()) {
    if (from == running)  // this OpenBLAS build lacks the kernel it was asked for
      return running + " (OpenBLAS did not take OPENBLAS_CORETYPE=" + env("OPENBLAS_CORETYPE") + " on this " +
             isa_name(detect_cpu_isa()) + " CPU)";
    return running + " (corrected from " + from + " on this " + isa_name(detect_cpu_isa()) + " CPU)";
  }
  if (!env("OPENBLAS_CORETYPE").empty()) {
    const std::string better = better_openblas_core(running, detect_cpu_isa());
    return running + " (OPENBLAS_CORETYPE" +
           (better.empty() ? ")" : "; this CPU runs " + better + ": unset it, or PIPETRAIN_BLAS_KERNEL=best)");
  }
  return running + " (detected)";
#else
  return running;
#endif
}

}  // namespace pipetrain
