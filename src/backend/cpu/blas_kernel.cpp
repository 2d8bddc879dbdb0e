#include "pipetrain/backend/blas_kernel.hpp"

#include <fmt/format.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef PIPETRAIN_HAVE_OPENBLAS
#include <cblas.h>
#endif

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/backend/blas_self_check.hpp"
#include "pipetrain/core/fault.hpp"

extern char** environ;

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

namespace {

constexpr const char* kPinned = "PIPETRAIN_BLAS_PINNED";        // OPENBLAS_CORETYPE was set before the correction
constexpr const char* kCheckChild = "PIPETRAIN_BLAS_CHECK";      // this process is the check of that core
constexpr const char* kCheckFailed = "PIPETRAIN_BLAS_CHECK_FAILED";
constexpr int kCheckSeconds = 30;

#ifdef PIPETRAIN_HAVE_OPENBLAS
// The checking child: OpenBLAS loaded with the core under test; its products against the
// reference. One line on stdout, exit 0 when they pass.
[[noreturn]] void run_check_child(const std::string& expected) {
  int code = 1;
  try {
    fault::arm_from_environment(0);
    fault::point("blas-check");
    const std::string running = blas_kernel_name();
    if (running != expected) {
      std::printf("OpenBLAS ran its %s kernel when asked for %s\n", running.c_str(), expected.c_str());
    } else {
      const ProductCheck c = check_sgemm([](bool ta, bool tb, int M, int N, int K, float alpha, const float* A,
                                            int lda, const float* B, int ldb, float beta, float* C, int ldc) {
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A,
                    lda, B, ldb, beta, C, ldc);
      });
      if (c.passed) {
        std::printf("passed: %d products, within %.2f of their bounds\n", c.products, c.worst);
        code = 0;
      } else {
        std::printf("%s\n", c.failure.c_str());
      }
    }
  } catch (const std::exception& e) {
    std::printf("%s\n", e.what());
  }
  std::fflush(stdout);
  std::_Exit(code);
}

// Runs this executable as the check of OpenBLAS core `core`; what it said, and whether it passed.
std::pair<bool, std::string> check_core_in_child(const std::string& core) {
  int out[2];
  if (::pipe(out) != 0) return {false, std::string("no pipe: ") + std::strerror(errno)};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  std::vector<std::string> vars = {std::string(kCheckChild) + "=" + core, "OPENBLAS_CORETYPE=" + core,
                                   "OPENBLAS_NUM_THREADS=1"};
  for (char** e = environ; *e; ++e) {
    const std::string v = *e;
    if (v.rfind("OPENBLAS_CORETYPE=", 0) != 0 && v.rfind("OPENBLAS_NUM_THREADS=", 0) != 0) vars.push_back(v);
  }
  std::vector<char*> envp;
  for (std::string& v : vars) envp.push_back(v.data());
  envp.push_back(nullptr);
  char self[] = "/proc/self/exe";
  char* child_argv[] = {self, nullptr};
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, self, &actions, nullptr, child_argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  if (rc != 0) {
    ::close(out[0]);
    return {false, std::string("could not start the check: ") + std::strerror(rc)};
  }
  std::string said;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(kCheckSeconds);
  bool timed_out = false;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{out[0], POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char buf[512];
    const ssize_t n = ::read(out[0], buf, sizeof buf);
    if (n <= 0) break;
    said.append(buf, static_cast<size_t>(n));
  }
  ::close(out[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  while (!said.empty() && (said.back() == '\n' || said.back() == '\r')) said.pop_back();
  if (timed_out) return {false, fmt::format("its check did not finish within {} s", kCheckSeconds)};
  if (WIFSIGNALED(status)) return {false, fmt::format("its check died of signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)))};
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return {false, said.empty() ? "its check failed" : said};
  return {true, said};
}
#endif

}  // namespace

void select_blas_kernel(char** argv) {
#ifdef PIPETRAIN_HAVE_OPENBLAS
  if (const std::string core = env(kCheckChild); !core.empty()) run_check_child(core);
  const std::string policy = env("PIPETRAIN_BLAS_KERNEL");
  if (policy != "" && policy != "auto" && policy != "best" && policy != "keep") {
    std::fprintf(stderr, "pipetrain: PIPETRAIN_BLAS_KERNEL=%s: expected auto, best or keep\n", policy.c_str());
    std::exit(2);
  }
  if (policy == "keep" || !env(kCorrectedFrom).empty() || !env(kCheckFailed).empty()) return;  // never twice
  const std::string running = blas_kernel_name();
  const std::string better = better_openblas_core(running, detect_cpu_isa());
  if (better.empty()) return;
  // A pinned core (OPENBLAS_CORETYPE) or OpenBLAS's fallback is replaced only by a core
  // whose products pass the check here.
  const auto [passed, said] = check_core_in_child(better);
  if (!passed) {
    ::setenv(kCheckFailed, (better + " failed its product check here: " + said).c_str(), 1);
    return;
  }
  const std::string pin = env("OPENBLAS_CORETYPE");
  if (!pin.empty()) ::setenv(kPinned, "1", 1);
  ::setenv(kCorrectedFrom, running.c_str(), 1);
  ::setenv("OPENBLAS_CORETYPE", better.c_str(), 1);
  ::execv("/proc/self/exe", argv);
  // Could not re-execute (no /proc?): run on, with the slow kernel, and say so.
  std::fprintf(stderr, "pipetrain: warning: OpenBLAS runs its %s kernel on this %s CPU; set OPENBLAS_CORETYPE=%s "
               "for its %s kernel (re-executing failed: %s)\n",
               running.c_str(), isa_name(detect_cpu_isa()), better.c_str(), better.c_str(), std::strerror(errno));
  ::unsetenv(kCorrectedFrom);
  ::unsetenv(kPinned);
  if (pin.empty())
    ::unsetenv("OPENBLAS_CORETYPE");
  else
    ::setenv("OPENBLAS_CORETYPE", pin.c_str(), 1);
#else
  (void)argv;
#endif
}

std::string blas_kernel_summary() {
  const std::string running = blas_kernel_name();
#ifdef PIPETRAIN_HAVE_OPENBLAS
  const std::string isa = isa_name(detect_cpu_isa());
  if (const std::string from = env(kCorrectedFrom); !from.empty()) {
    if (from == running)  // this OpenBLAS build lacks the kernel it was asked for
      return running + " (OpenBLAS did not take OPENBLAS_CORETYPE=" + env("OPENBLAS_CORETYPE") + " on this " + isa +
             " CPU)";
    return running + " (corrected from " + from + (env(kPinned).empty() ? "" : ", pinned by OPENBLAS_CORETYPE,") +
           " on this " + isa + " CPU; its products checked here)";
  }
  if (const std::string failed = env(kCheckFailed); !failed.empty())
    return running + (env("OPENBLAS_CORETYPE").empty() ? " (detected; " : " (OPENBLAS_CORETYPE; ") + failed + ")";
  if (!env("OPENBLAS_CORETYPE").empty()) {
    const std::string better = better_openblas_core(running, detect_cpu_isa());
    return running + " (OPENBLAS_CORETYPE" +
           (better.empty() ? ")" : "; this CPU runs " + better + ": kept by PIPETRAIN_BLAS_KERNEL=keep)");
  }
  if (env("PIPETRAIN_BLAS_KERNEL") == "keep" && !better_openblas_core(running, detect_cpu_isa()).empty())
    return running + " (detected; kept by PIPETRAIN_BLAS_KERNEL=keep)";
  return running + " (detected)";
#else
  return running;
#endif
}

}  // namespace pipetrain
