#include "pipetrain/backend/blas_threads.hpp"

#include <cstdlib>

#include <fmt/format.h>

#ifdef PIPETRAIN_HAVE_OPENBLAS
#include <cblas.h>
#endif

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/backend/bf16_products.hpp"

namespace pipetrain {

namespace {

std::string& how() {
  static std::string text;
  return text;
}

}  // namespace

int blas_threads_share(int cpus, int sharers) {
  if (cpus < 1) return 1;
  const int share = cpus / (sharers < 1 ? 1 : sharers);
  return share < 1 ? 1 : share;
}

void apply_blas_threads(int cpus, int sharers) {
  for (const char* var : {"OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"}) {
    const char* v = std::getenv(var);
    if (v && *v) {
      how() = fmt::format("({})", var);
#ifdef PIPETRAIN_HAVE_OPENBLAS
      // oneDNN (OpenMP) takes the BLAS's count too, unless OMP_NUM_THREADS set its own:
      // products timed against each other run on as many threads.
      const char* omp = std::getenv("OMP_NUM_THREADS");
      if (!omp || !*omp) set_onednn_threads(openblas_get_num_threads());
#endif
      return;
    }
  }
  const int n = blas_threads_share(cpus, sharers);
  set_blas_threads(n);
  how() = sharers > 1 ? fmt::format("({} CPU{} shared by {} ranks)", cpus, cpus == 1 ? "" : "s", sharers)
                      : fmt::format("({} CPU{} of its own)", cpus, cpus == 1 ? "" : "s");
}

std::string blas_threads_summary() {
#ifdef PIPETRAIN_HAVE_OPENBLAS
  const int n = openblas_get_num_threads();
  const std::string count = fmt::format("{} thread{}", n, n == 1 ? "" : "s");
  return how().empty() ? count : count + " " + how();
#else
  return "threads as the BLAS sets them";
#endif
}

}  // namespace pipetrain
