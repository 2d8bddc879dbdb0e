// bench_moe: the rate of a mixture of experts' grouped products (one sgemm per expert over
// its contiguous rows, as model/moe_mlp.cpp runs them) against the same FLOPs as one dense
// product per matrix over all the routed rows, in the same run. Shapes: GPT-2 small's width
// (d_model 768, experts of width 3072), 8 experts, top 2; the rows per expert from
// route_tokens on random logits (the load a fresh router gives). The nine products of a
// SwiGLU expert's training step: forward gate, up, down; input gradients; weight gradients.
// Also the router's forward and backward on the host (the CPU backend's, backend/moe_routing.hpp)
// against the products' time: what routing costs a layer.
// Usage: bench_moe [--tokens N] [--experts E] [--top-k K] [--ffn F] [--reps R]
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/backend/blas_kernel.hpp"
#include "pipetrain/backend/blas_threads.hpp"
#include "pipetrain/backend/moe_routing.hpp"
#include "pipetrain/core/rng.hpp"
#include "pipetrain/core/runtime_env.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<float> random_values(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  pipetrain::Rng rng(seed);
  for (float& x : v) x = static_cast<float>(rng.normal() * 0.02);
  return v;
}

// The nine products of a SwiGLU of width F on `rows` rows at row offset `at`: x (rows, C),
// gate/up (F, C), down (C, F); activations and gradients in matching buffers.
struct Buffers {
  std::vector<float> x, g, u, o, wg, wu, wd, dwg, dwu, dwd, dx;
};

void expert_products(pipetrain::Backend& be, Buffers& b, int at, int rows, int C, int F, size_t weights_at) {
  if (rows == 0) return;
  const float *x = b.x.data() + size_t(at) * C, *wg = b.wg.data() + weights_at, *wu = b.wu.data() + weights_at,
              *wd = b.wd.data() + weights_at;
  float *g = b.g.data() + size_t(at) * F, *u = b.u.data() + size_t(at) * F, *o = b.o.data() + size_t(at) * C,
        *dx = b.dx.data() + size_t(at) * C;
  be.gemm(false, true, rows, F, C, 1, x, C, wg, C, 0, g, F);  // forward
  be.gemm(false, true, rows, F, C, 1, x, C, wu, C, 0, u, F);
  be.gemm(false, true, rows, C, F, 1, g, F, wd, F, 0, o, C);
  be.gemm(false, false, rows, F, C, 1, o, C, wd, F, 0, u, F);  // input gradients (dh, then dx)
  be.gemm(false, false, rows, C, F, 1, g, F, wg, C, 0, dx, C);
  be.gemm(false, false, rows, C, F, 1, u, F, wu, C, 1, dx, C);
  be.gemm(true, false, C, F, rows, 1, o, C, g, F, 1, b.dwd.data() + weights_at, F);  // weight gradients
  be.gemm(true, false, F, C, rows, 1, g, F, x, C, 1, b.dwg.data() + weights_at, C);
  be.gemm(true, false, F, C, rows, 1, u, F, x, C, 1, b.dwu.data() + weights_at, C);
}

// Median seconds of the router's forward (route_tokens) and backward on these logits.
std::pair<double, double> time_router(const std::vector<float>& logits, int tokens, const pipetrain::RouterSpec& spec,
                                      int reps) {
  const std::vector<float> dw = random_values(size_t(tokens) * spec.top_k, 6);
  std::vector<float> dl(logits.size());
  std::vector<double> tf, tb;
  for (int rep = 0; rep < reps + 1; ++rep) {
    auto t0 = Clock::now();
    const pipetrain::Routing r = pipetrain::route_tokens(logits.data(), nullptr, tokens, spec);
    auto t1 = Clock::now();
    pipetrain::router_backward(r, logits.data(), dw.data(), spec, 1.0, dl.data());
    auto t2 = Clock::now();
    if (rep == 0) continue;
    tf.push_back(std::chrono::duration<double>(t1 - t0).count());
    tb.push_back(std::chrono::duration<double>(t2 - t1).count());
  }
  return {median(tf), median(tb)};
}

}  // namespace

int main(int argc, char** argv) {
  pipetrain::select_blas_kernel(argv);  // as pipetrain: a fallback OpenBLAS kernel is replaced first
  pipetrain::KokkosSession kokkos(argc, argv);
  int tokens = 1024, experts = 8, top_k = 2, C = 768, F = 3072, reps = 5;
  CLI::App app{"grouped expert products against dense products of equal FLOPs"};
  app.add_option("--tokens", tokens);
  app.add_option("--experts", experts);
  app.add_option("--top-k", top_k);
  app.add_option("--ffn", F, "each expert's width");
  app.add_option("--reps", reps);
  CLI11_PARSE(app, argc, argv);
  pipetrain::set_blas_threads(1);
  auto be = pipetrain::make_cpu_backend();
  // Rows per expert: a fresh router's choice on random logits.
  const std::vector<float> logits = random_values(size_t(tokens) * experts, 3);
  const pipetrain::RouterSpec spec{experts, top_k, pipetrain::RouterKind::Softmax, true, 0, 0};
  const pipetrain::Routing r = pipetrain::route_tokens(logits.data(), nullptr, tokens, spec);
  const int R = tokens * top_k;
  Buffers grouped;
  grouped.x = random_values(size_t(R) * C, 4);
  grouped.g.resize(size_t(R) * F), grouped.u.resize(size_t(R) * F), grouped.o.resize(size_t(R) * C);
  grouped.dx.resize(size_t(R) * C);
  for (auto* w : {&grouped.wg, &grouped.wu, &grouped.wd}) *w = random_values(size_t(experts) * F * C, 5);
  for (auto* w : {&grouped.dwg, &grouped.dwu, &grouped.dwd}) w->assign(size_t(experts) * F * C, 0.0f);
  Buffers dense = grouped;  // one expert's weights serve the dense products (same shapes, same FLOPs)
  std::vector<double> tg, td;
  for (int rep = 0; rep < reps + 1; ++rep) {  // the first of each is a warm-up
    auto t0 = Clock::now();
    for (int e = 0; e < experts; ++e)
      expert_products(*be, grouped, r.offset[size_t(e)], r.count(e), C, F, size_t(e) * F * C);
    auto t1 = Clock::now();
    expert_products(*be, dense, 0, R, C, F, 0);
    auto t2 = Clock::now();
    if (rep == 0) continue;
    tg.push_back(std::chrono::duration<double>(t1 - t0).count());
    td.push_back(std::chrono::duration<double>(t2 - t1).count());
  }
  const double flops = 9.0 * 2.0 * R * double(C) * F;
  int most = 0, least = R;
  for (int e = 0; e < experts; ++e) most = std::max(most, r.count(e)), least = std::min(least, r.count(e));
  fmt::print("backend: {}\n{} tokens, top {} of {} experts: {} routed rows, {} to {} per expert; d_model {}, expert "
             "width {}\n",
             be->name(), tokens, top_k, experts, R, least, most, C, F);
  fmt::print("grouped (one sgemm per expert): {:.4f} s, {:.1f} GFLOP/s (median of {})\n", median(tg),
             flops / median(tg) / 1e9, reps);
  fmt::print("dense (one sgemm over all rows): {:.4f} s, {:.1f} GFLOP/s\n", median(td), flops / median(td) / 1e9);
  fmt::print("grouped / dense rate: {:.3f}\n", median(td) / median(tg));
  const auto [route_f, route_b] = time_router(logits, tokens, spec, reps);
  fmt::print("router: forward {:.2f} ms, backward {:.2f} ms: {:.2f}% of the grouped products' time\n", 1e3 * route_f,
             1e3 * route_b, 100 * (route_f + route_b) / median(tg));
  return 0;
}
