// bench_gemm_rate: the bf16 product rate of a backend (Backend::gemm_bf16: bf16 operands,
// f32 accumulation) at GPT-2 124M training shapes, the reference an MFU is measured
// against (scripts/gpu-check.sh divides the model's FLOP/s by the best rate printed
// here). Medians of repeated runs; the last line is the best: "best TFLOP/s".
// Usage: bench_gemm_rate [cpu|cuda] [tokens] [reps]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/backend/blas_kernel.hpp"
#include "pipetrain/backend/cuda.hpp"
#include "pipetrain/core/runtime_env.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Shape {
  const char* what;
  bool ta, tb;
  int M, N, K;
};

}  // namespace

int main(int argc, char** argv) {
  pipetrain::select_blas_kernel(argv);  // as pipetrain: a fallback OpenBLAS kernel is replaced first
  pipetrain::KokkosSession kokkos(argc, argv);
  const std::string device = argc > 1 ? argv[1] : "cpu";
  const int tokens = argc > 2 ? std::max(32, std::atoi(argv[2])) : (device == "cuda" ? 8192 : 1024);
  const int reps = argc > 3 ? std::max(1, std::atoi(argv[3])) : 5;
  auto be = device == "cuda" ? pipetrain::make_cuda_backend() : pipetrain::make_cpu_backend();
  std::printf("backend: %s\n", be->name().c_str());
  const int C = 768;
  // The block's products, forward and backward (Y = X W^T; dX = dY W; dW += dY^T X), and
  // the LM head's (a 50304-row table: its weights do not fit in a core's caches).
  const Shape shapes[] = {{"qkv forward", false, true, tokens, 3 * C, C},
                          {"fc forward", false, true, tokens, 4 * C, C},
                          {"fc proj forward", false, true, tokens, C, 4 * C},
                          {"fc backward input", false, false, tokens, C, 4 * C},
                          {"fc backward weight", true, false, 4 * C, C, tokens},
                          {"head forward", false, true, tokens, 50304, C},
                          {"head backward input", false, false, tokens, C, 50304},
                          {"head backward weight", true, false, 50304, C, tokens}};
  double best = 0;
  for (const Shape& s : shapes) {
    const size_t na = size_t(s.M) * s.K, nb = size_t(s.N) * s.K, nc = size_t(s.M) * s.N;
    std::vector<pipetrain::bf16> ha(na), hb(nb);
    for (size_t i = 0; i < na; ++i) ha[i] = pipetrain::to_bf16(static_cast<float>((i * 7919) % 1000) / 1000.0f - 0.5f);
    for (size_t i = 0; i < nb; ++i) hb[i] = pipetrain::to_bf16(static_cast<float>((i * 104729) % 1000) / 1000.0f - 0.5f);
    auto* a = static_cast<pipetrain::bf16*>(be->allocate(na * sizeof(pipetrain::bf16)));
    auto* b = static_cast<pipetrain::bf16*>(be->allocate(nb * sizeof(pipetrain::bf16)));
    auto* c = static_cast<float*>(be->allocate(nc * sizeof(float)));
    be->to_device(a, ha.data(), na * sizeof(pipetrain::bf16));
    be->to_device(b, hb.data(), nb * sizeof(pipetrain::bf16));
    const int lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
    auto run = [&] {
      be->gemm_bf16(s.ta, s.tb, s.M, s.N, s.K, 1.0f, a, lda, b, ldb, 0.0f, c, s.N);
      be->stream().synchronize();
    };
    run();  // warm-up (and cuBLASLt's heuristic)
    std::vector<double> ms;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = Clock::now();
      run();
      ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2], tflops = 2.0 * s.M * s.N * s.K / med / 1e9;
    best = std::max(best, tflops);
    std::printf("gemm_bf16 %-18s %5d x %5d x %5d: %8.3f ms, %7.3f TFLOP/s\n", s.what, s.M, s.N, s.K, med, tflops);
    be->deallocate(a, na * sizeof(pipetrain::bf16));
    be->deallocate(b, nb * sizeof(pipetrain::bf16));
    be->deallocate(c, nc * sizeof(float));
  }
  std::printf("best %.3f TFLOP/s\n", best);
  return 0;
}
