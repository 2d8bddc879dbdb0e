// The training-throughput benchmark behind bench_train_gpt2 and bench_train_llama:
// single-rank, single-thread training throughput as a fraction of the BLAS sgemm rate
// measured in the same run (after the warm-up and after every step: each step against the
// rate around it, and the medians), so a noisy shared machine affects both sides alike,
// with the rate's range printed — and as a fraction of the best sgemm this
// machine offers: every OpenBLAS kernel the CPU can run, and oneDNN's sgemm where it is
// built in, is measured in a child process (OPENBLAS_CORETYPE is read when the library
// loads), so a slow kernel cannot hide behind
// a ratio to itself. Like `pipetrain`, the benchmark first replaces a fallback OpenBLAS
// kernel by the best one (pipetrain/backend/blas_kernel.hpp).
//
//   build/bin/bench_train_{gpt2,llama} [--layers 12] [--seq-len 256] [--mb-size 4]
//       [--microbatches 1] [--steps 5] [--threads 1] [--recompute none|selective|full]
//       [--precision fp32|bf16] [--pack-weights[=auto|true|false]] [--dense-products auto|blas|onednn]
// Under bf16 it also sets the model against the bf16 product rate of the path in use
// (PIPETRAIN_BF16_GEMM=sgemm or onednn, run in turn, compares the two).
#pragma once
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <vector>

#include "pipetrain/core/malloc_policy.hpp"
#include "pipetrain/backend/backend.hpp"
#ifdef PIPETRAIN_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif
#include "pipetrain/backend/bf16_products.hpp"
#include "pipetrain/backend/blas_kernel.hpp"
#include "pipetrain/core/dtype.hpp"
#include "pipetrain/core/rng.hpp"
#include "pipetrain/core/runtime_env.hpp"
#include "bench_common.hpp"
#include "pipetrain/runtime/trainer.hpp"
#include "pipetrain/topology/grid.hpp"

namespace pipetrain::bench::train_detail {

// GFLOP/s of C = A B^T with the given shape in element type T (float: Backend::gemm; bf16:
// Backend::gemm_bf16, the path this process's bf16 products take, bf16_products.hpp),
// median of `reps` runs after a warm-up.
template <class T>
double product_gflops(Backend& be, int M, int N, int K, int reps) {
  const auto value = [](float x) {
    if constexpr (std::is_same_v<T, bf16>) return to_bf16(x);
    else return x;
  };
  std::vector<T> a(static_cast<size_t>(M) * K, value(0.5f)), b(static_cast<size_t>(N) * K, value(0.25f));
  std::vector<float> c(static_cast<size_t>(M) * N);
  const auto run = [&] {
    if constexpr (std::is_same_v<T, bf16>)
      be.gemm_bf16(false, true, M, N, K, 1.0f, a.data(), K, b.data(), K, 0.0f, c.data(), N);
    else
      be.gemm(false, true, M, N, K, 1.0f, a.data(), K, b.data(), K, 0.0f, c.data(), N);
  };
  run();
  std::vector<double> rates;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    run();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rates.push_back(2.0 * M * N * K / s / 1e9);
  }
  return median(rates);
}
inline double sgemm_gflops(Backend& be, int M, int N, int K, int reps) { return product_gflops<float>(be, M, N, K, reps); }
inline double bf16_gemm_gflops(Backend& be, int M, int N, int K, int reps) {
  return product_gflops<bf16>(be, M, N, K, reps);
}

struct KernelRate {
  std::string kernel;
  double square = 0, model = 0;  // GFLOP/s: 2048^3 and the model's QKV shape
};

// The QKV product of a microbatch: M = tokens, N = 3 d, K = d.
constexpr int kD = 768;

// Child mode (`--sgemm-only TOKENS`): the two sgemm rates under this process's kernel.
inline int sgemm_only(int tokens) {
  set_blas_threads(1);
  auto be = make_cpu_backend();
  std::printf("%s %.3f %.3f\n", blas_kernel_name().c_str(), sgemm_gflops(*be, 2048, 2048, 2048, 5),
              sgemm_gflops(*be, tokens, 3 * kD, kD, 5));
  return 0;
}

// Child mode (`--onednn-sgemm-only TOKENS`): the same two rates of oneDNN's f32 sgemm
// (dnnl_sgemm, row-major), the other f32 product library installed; nothing where
// pipetrain was built without oneDNN.
inline int onednn_sgemm_only(int tokens) {
#ifdef PIPETRAIN_HAVE_ONEDNN
  set_blas_threads(1);  // oneDNN's threads follow
  const auto rate = [](int M, int N, int K) {
    std::vector<float> a(static_cast<size_t>(M) * K, 0.5f), b(static_cast<size_t>(N) * K, 0.25f),
        c(static_cast<size_t>(M) * N);
    const auto run = [&] { dnnl_sgemm('N', 'T', M, N, K, 1.0f, a.data(), K, b.data(), K, 0.0f, c.data(), N); };
    run();
    std::vector<double> rates;
    for (int r = 0; r < 5; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      run();
      rates.push_back(2.0 * M * N * K / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                      1e9);
    }
    return median(rates);
  };
  std::printf("oneDNN-sgemm %.3f %.3f\n", rate(2048, 2048, 2048), rate(tokens, 3 * kD, kD));
#else
  (void)tokens;
#endif
  return 0;
}

// Every OpenBLAS kernel this CPU can run, and oneDNN's sgemm where it is built in, each
// measured in a child process.
inline std::vector<KernelRate> every_kernel(const char* self, int tokens) {
  const CpuIsa isa = detect_cpu_isa();
  std::vector<std::string> kernels = {"Prescott"};
  if (isa.avx) kernels.push_back("Sandybridge");
  if (isa.avx2_fma) kernels.push_back(isa.amd ? "Zen" : "Haswell");
  if (isa.avx2_fma && isa.amd) kernels.push_back("Haswell");
  if (isa.avx512) kernels.push_back("SkylakeX");
  if (isa.avx512_bf16) kernels.push_back("Cooperlake");
  std::vector<KernelRate> out;
  std::vector<std::string> commands;
  for (const auto& k : kernels)
    commands.push_back("env OPENBLAS_CORETYPE=" + k + " PIPETRAIN_BLAS_KERNEL=keep '" + self + "' --sgemm-only " +
                       std::to_string(tokens));
  commands.push_back(std::string("'") + self + "' --onednn-sgemm-only " + std::to_string(tokens));
  for (const auto& cmd : commands) {
    FILE* p = ::popen(cmd.c_str(), "r");
    if (!p) continue;
    char name[64] = {};
    KernelRate r;
    if (std::fscanf(p, "%63s %lf %lf", name, &r.square, &r.model) == 3) {
      r.kernel = name;
      out.push_back(r);
    }
    ::pclose(p);
  }
  return out;
}

}  // namespace pipetrain::bench::train_detail

namespace pipetrain::bench {

// The whole benchmark for model.arch = `arch`: GPT-2 124M's shapes, or a Llama of about
// 100M parameters in its products (d_model 768, 12 layers, 12 query heads on 4 key/value
// heads, SwiGLU 2048, a 32000-token vocabulary, untied head).
inline int train_benchmark(int argc, char** argv, const std::string& arch) {
  using namespace train_detail;
  if (argc == 3 && std::strcmp(argv[1], "--sgemm-only") == 0) return sgemm_only(std::atoi(argv[2]));
  if (argc == 3 && std::strcmp(argv[1], "--onednn-sgemm-only") == 0) return onednn_sgemm_only(std::atoi(argv[2]));
  select_blas_kernel(argv);  // as pipetrain does: a fallback kernel is replaced first
  keep_freed_host_memory();  // as pipetrain: freed blocks below 32 MiB reused
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  {
  KokkosSession kokkos(argc, argv);
  int layers = 12, seq_len = 256, mb_size = 4, microbatches = 1, steps = 5, threads = 1;
  CLI::App app{"GPT-2 124M-shape training throughput vs the same-run sgemm rate"};
  app.add_option("--layers", layers);
  app.add_option("--seq-len", seq_len);
  app.add_option("--mb-size", mb_size, "sequences per microbatch");
  app.add_option("--microbatches", microbatches);
  app.add_option("--steps", steps, "timed steps (after one warm-up step)");
  app.add_option("--threads", threads, "BLAS threads");
  std::string recompute = "none";
  app.add_option("--recompute", recompute, "train.recompute: none, selective or full");
  std::string precision = "fp32";
  app.add_option("--precision", precision, "train.precision: fp32 or bf16");
  std::string pack_weights;
  bench::add_pack_weights(app, pack_weights, "weights in oneDNN's layout during each step");
  std::string dense_products = "auto";
  app.add_option("--dense-products", dense_products,
                 "runtime.dense_products: auto (timed at start-up, not kept), blas or onednn");
  if (auto rc = bench::parse_args(app, argc, argv)) return *rc;
  set_blas_threads(threads);

  Config cfg;
  if (arch == "llama") {
    cfg.model.arch = "llama";
    cfg.model.n_kv_head = 4;
    cfg.model.vocab_size = 32000;
    cfg.model.rope_theta = 500000;
  }
  cfg.model.n_layer = layers;
  cfg.model.max_seq_len = std::max(1024, seq_len);
  cfg.train.seq_len = seq_len;
  cfg.train.global_batch = mb_size * microbatches;
  cfg.train.microbatches = microbatches;
  cfg.train.steps = steps + 1;
  cfg.train.recompute = recompute;
  cfg.train.precision = precision;
  cfg.runtime.pack_weights = bench::pack_toggle(pack_weights);
  cfg.runtime.dense_products = dense_products;
  cfg.checkpoint.dir = "";  // the paths timed afresh each run, nothing written
  auto backend = make_cpu_backend();
  Grid grid(MPI_COMM_SELF, cfg.parallel);
  Trainer trainer(cfg, grid, *backend, random_tokens(cfg.model.vocab_size, seq_len));
  const int64_t nparams = trainer.model_params();
  const double flops_per_token = model_flops_per_token(cfg.model, nparams, seq_len);
  const int tokens_mb = mb_size * seq_len;

  // Before any training allocation: the children measure on a quiet process.
  char self[4096] = {};
  const ssize_t len = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  const std::vector<KernelRate> kernels = len > 0 ? every_kernel(self, tokens_mb) : std::vector<KernelRate>{};
  fmt::print("backend: {}\nBLAS kernel: {}, threads {}\n", backend->name(), blas_kernel_summary(), threads);
  if (!trainer.dense_products().why.empty()) fmt::print("dense products: {}\n", trainer.dense_products().why);
  fmt::print("model: {} {} layers, d_model {}, {:.2f}M params; {} tokens/microbatch x {} microbatches\n",
             arch == "llama" ? fmt::format("Llama ({} key/value heads, SwiGLU {}, untied)", cfg.model.kv_heads(),
                                           cfg.model.ffn())
                             : std::string("GPT-2"),
             layers, cfg.model.d_model, nparams / 1e6, tokens_mb, microbatches);

  std::vector<double> gemm_square, gemm_model, bf16_square;
  const bool bf16 = precision == "bf16";
  auto measure_gemm = [&] {
    gemm_square.push_back(sgemm_gflops(*backend, 2048, 2048, 2048, 5));
    gemm_model.push_back(sgemm_gflops(*backend, tokens_mb, 3 * cfg.model.d_model, cfg.model.d_model, 5));
    if (bf16) bf16_square.push_back(bf16_gemm_gflops(*backend, 2048, 2048, 2048, 5));
  };
  trainer.train_step(0);  // warm-up: fills the memory pool
  measure_gemm();  // and again after every step: each step is set against the rate around it
  std::vector<double> step_s, program_s, tail_s[3];  // tail: reductions, norm, optimizer
  double activations = 0;  // the step's pool peak above what it starts with: stash + working tensors
  for (int s = 1; s <= steps; ++s) {
    const size_t before = trainer.pool().stats().in_use_bytes;
    trainer.pool().reset_peak();
    const StepMetrics m = trainer.train_step(s);
    activations = std::max(activations, static_cast<double>(trainer.pool().stats().peak_in_use_bytes - before));
    step_s.push_back(m.step_time_s);
    program_s.push_back(m.phases.program_s);
    tail_s[0].push_back(m.phases.reduce_s);
    tail_s[1].push_back(m.phases.norm_s);
    tail_s[2].push_back(m.phases.optimizer_s);
    fmt::print("step {}: loss {:.4f}, {:.3f} s\n", s, m.loss, m.step_time_s);
    measure_gemm();
  }

  const double t = median(step_s);
  const double tokens_per_s = static_cast<double>(trainer.tokens_per_step()) / t;
  const double model_gflops = tokens_per_s * flops_per_token / 1e9;
  const double sq = median(gemm_square), mo = median(gemm_model);
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  fmt::print("\nstep time (median of {}): {:.3f} s, {:.0f} tokens/s\n", steps, t, tokens_per_s);
  fmt::print("where it went (medians): program {:.3f} s, reductions {:.3f} s, norm {:.3f} s, optimizer {:.3f} s\n",
             median(program_s), median(tail_s[0]), median(tail_s[1]), median(tail_s[2]));
  fmt::print("model FLOP/s: {:.1f} GFLOP/s ({:.3g} GFLOP/token)\n", model_gflops, flops_per_token / 1e9);
  fmt::print("sgemm 2048^3:           {:.1f} GFLOP/s -> model/sgemm = {:.3f}\n", sq, model_gflops / sq);
  if (bf16)
    fmt::print("bf16 products 2048^3 ({}): {:.1f} GFLOP/s -> model/that = {:.3f}\n", bf16_products_summary(),
               median(bf16_square), model_gflops / median(bf16_square));
  fmt::print("sgemm {}x{}x{} (QKV): {:.1f} GFLOP/s -> model/sgemm = {:.3f}\n", tokens_mb,
             3 * cfg.model.d_model, cfg.model.d_model, mo, model_gflops / mo);
  // A machine whose speed drifts (a shared VM) moves both sides of the ratio: each step
  // against the mean of the sgemm rates measured just before and just after it.
  std::vector<double> per_step;
  for (size_t i = 0; i < step_s.size(); ++i)
    per_step.push_back(static_cast<double>(trainer.tokens_per_step()) / step_s[i] * flops_per_token / 1e9 /
                       (0.5 * (gemm_square[i] + gemm_square[i + 1])));
  const auto [lo, hi] = std::minmax_element(gemm_square.begin(), gemm_square.end());
  fmt::print("model/sgemm, each step against the 2048^3 rate around it: median {:.3f} ({:.3f})\n", median(per_step),
             fmt::join(per_step, ", "));
  fmt::print("sgemm 2048^3 during the run: {:.1f} to {:.1f} GFLOP/s{}\n", *lo, *hi,
             *hi > 1.1 * *lo ? " (this machine's speed changed by more than 10%: the ratios carry that uncertainty)" : "");
  // Against the best kernel the machine offers (the same shapes, measured alone).
  if (!kernels.empty() && cfg.model.d_model == kD) {
    fmt::print("every OpenBLAS kernel this CPU runs, and oneDNN's (sgemm 2048^3 / QKV, GFLOP/s, one thread):\n");
    const KernelRate* best = &kernels.front();
    for (const auto& k : kernels) {
      fmt::print("  {:<12} {:7.1f} {:7.1f}\n", k.kernel, k.square, k.model);
      if (k.square > best->square) best = &k;
    }
    fmt::print("best available: {} {:.1f} GFLOP/s -> model/best sgemm = {:.3f} (QKV shape: {:.3f}){}\n", best->kernel,
               best->square, model_gflops / best->square, model_gflops / best->model,
               best->square < *lo ? "; the children ran slower than any moment of the steps: read the drift-corrected line"
                                  : "");
    // The children ran before the steps; on a machine whose speed drifts, the kernel that
    // ran, measured among them, carries the best one over to the steps' own moment.
    const std::string ran = blas_kernel_name();
    for (const auto& k : kernels)
      if (k.kernel == ran && k.square > 0)
        fmt::print("drift-corrected: model/sgemm x {} / {} among the children = {:.3f} by the medians, {:.3f} each step "
                   "against the rate around it\n",
                   k.kernel, best->kernel, model_gflops / sq * k.square / best->square,
                   median(per_step) * k.square / best->square);
  }
  if (trainer.packs_weights()) {
    const Backend::PackedWeights held = backend->packed_weights();
    fmt::print("packed weights: {} products by oneDNN's copies; the copies hold {:.1f}M elements in {:.0f} MiB "
               "({:.4f} bytes per element)\n",
               packed_dense_products_run(), held.elements / 1e6, held.bytes / 1048576.0,
               held.elements > 0 ? static_cast<double>(held.bytes) / static_cast<double>(held.elements) : 0.0);
  }
  fmt::print("recompute {}: activation memory {:.0f} MiB (the step's pool peak above its start)\n", recompute,
             activations / 1048576.0);
  fmt::print("peak pooled memory: {:.0f} MiB; peak RSS: {:.0f} MiB\n",
             trainer.pool().stats().peak_in_use_bytes / 1048576.0, ru.ru_maxrss / 1024.0);
  }
  MPI_Finalize();
  return 0;
}

}  // namespace pipetrain::bench
