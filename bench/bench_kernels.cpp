// bench_kernels: times the CPU backend's kernels at GPT-2 124M shapes next to
// a raw sgemm measured in the same run (medians of repeated runs; no
// assertions). Like pipetrain, it first replaces a fallback OpenBLAS kernel by the
// CPU's best. Usage: bench_kernels [reps]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/backend/bf16_products.hpp"
#include "pipetrain/backend/blas_kernel.hpp"
#include "pipetrain/core/runtime_env.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double median_ms(int reps, const std::function<void()>& f) {
  f();  // warm-up
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::vector<float> randv(size_t n, float lo, float hi, unsigned seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  pipetrain::select_blas_kernel(argv);
  pipetrain::KokkosSession kokkos(argc, argv);
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  auto be = pipetrain::make_cpu_backend();
  std::printf("backend: %s\n", be->name().c_str());

  {  // sgemm reference: (1024 x 768) * (768 x 3072), the fc layer of GPT-2 124M
    const int M = 1024, K = 768, N = 3072;
    auto A = randv(size_t(M) * K, -1, 1, 1), B = randv(size_t(K) * N, -1, 1, 2);
    std::vector<float> C(size_t(M) * N);
    const double ms = median_ms(reps, [&] {
      be->gemm(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, C.data(), N);
    });
    std::printf("sgemm %dx%dx%d: %.3f ms, %.1f GFLOP/s\n", M, N, K, ms, 2.0 * M * N * K / ms / 1e6);
  }
  {  // a block's four forward products with their biases (and residuals, for the two
     // projections), N = 1024: the product, then bias and residual passes (the composition
     // before gemm_bias), against gemm_bias; the two alternate, medians of each
    const int N = 1024, C = 768;
    struct Shape { int out, in; bool residual; };
    const Shape shapes[] = {{3 * C, C, false}, {C, C, true}, {4 * C, C, false}, {C, 4 * C, true}};
    std::vector<std::vector<float>> x, w, b, r, y;
    unsigned seed = 20;
    for (const Shape& sh : shapes) {
      x.push_back(randv(size_t(N) * sh.in, -1, 1, ++seed));
      w.push_back(randv(size_t(sh.out) * sh.in, -0.05f, 0.05f, ++seed));
      b.push_back(randv(size_t(sh.out), -1, 1, ++seed));
      r.push_back(randv(size_t(N) * sh.out, -1, 1, ++seed));
      y.push_back(std::vector<float>(size_t(N) * sh.out));
    }
    auto separate = [&] {
      for (size_t i = 0; i < 4; ++i) {
        const Shape& sh = shapes[i];
        be->gemm(false, true, N, sh.out, sh.in, 1.0f, x[i].data(), sh.in, w[i].data(), sh.in, 0.0f, y[i].data(),
                 sh.out);
        be->bias_add(y[i].data(), b[i].data(), N, sh.out);
        if (sh.residual) be->accumulate(y[i].data(), r[i].data(), size_t(N) * sh.out);
      }
    };
    auto fused = [&] {
      for (size_t i = 0; i < 4; ++i) {
        const Shape& sh = shapes[i];
        be->gemm_bias(false, true, N, sh.out, sh.in, x[i].data(), sh.in, w[i].data(), sh.in, y[i].data(), sh.out,
                      b[i].data(), sh.residual ? r[i].data() : nullptr);
      }
    };
    std::vector<double> t_sep, t_fused;
    for (int i = 0; i < 2 * reps + 1; ++i) {
      t_sep.push_back(median_ms(1, separate));
      t_fused.push_back(median_ms(1, fused));
    }
    std::sort(t_sep.begin(), t_sep.end());
    std::sort(t_fused.begin(), t_fused.end());
    const double flop = 2.0 * N * C * C * (3 + 1 + 4 + 4);
    std::printf("block forward products N=%d (bias, residual): separate passes %.2f ms (%.1f GFLOP/s), "
                "gemm_bias %.2f ms (%.1f GFLOP/s)\n",
                N, t_sep[t_sep.size() / 2], flop / t_sep[t_sep.size() / 2] / 1e6, t_fused[t_fused.size() / 2],
                flop / t_fused[t_fused.size() / 2] / 1e6);
  }
  {  // a block's twelve training products (forward, input and weight gradient of its four
     // weights) at 512 and at 1024 tokens, in alternation, fastest of each: whether a
     // product has a cost that does not shrink with its tokens (packing the weight, passes
     // over the weight gradient), which would make smaller microbatches and replicas slower
    const int C = 768, Ns[2] = {512, 1024};
    const int shapes[4][2] = {{3 * C, C}, {C, C}, {4 * C, C}, {C, 4 * C}};  // {out, in}
    auto x = randv(size_t(1024) * 4 * C, -1, 1, 40), dy = randv(size_t(1024) * 4 * C, -1, 1, 41);
    auto w = randv(size_t(4) * C * C, -0.05f, 0.05f, 42);
    std::vector<float> y(size_t(1024) * 4 * C), dw(size_t(4) * C * C, 0.0f);
    double best[2] = {1e30, 1e30};
    for (int i = 0; i < 2 * reps + 1; ++i)
      for (int k = 0; k < 2; ++k) {
        const int N = Ns[k];
        best[k] = std::min(best[k], median_ms(1, [&] {
          for (const auto& sh : shapes) {
            const int out = sh[0], in = sh[1];
            be->gemm(false, true, N, out, in, 1.0f, x.data(), in, w.data(), in, 0.0f, y.data(), out);
            be->gemm(false, false, N, in, out, 1.0f, dy.data(), out, w.data(), in, 0.0f, y.data(), in);
            be->gemm(true, false, out, in, N, 1.0f, dy.data(), out, x.data(), in, 1.0f, dw.data(), in);
          }
        }));
      }
    const double flop1 = 3 * 2.0 * C * C * 12;  // per token
    std::printf("block training products: N=512 %.2f ms (%.1f GFLOP/s), N=1024 %.2f ms (%.1f GFLOP/s); "
                "time(1024) / time(512) = %.2f\n",
                best[0], flop1 * 512 / best[0] / 1e6, best[1], flop1 * 1024 / best[1] / 1e6, best[1] / best[0]);
  }
  {  // cross-entropy over the padded GPT-2 vocabulary, with the fused gradient
    const int N = 1024, V = 50257, Vp = 50304;
    const auto logits0 = randv(size_t(N) * Vp, -4, 4, 3);
    std::vector<float> logits(logits0), losses(N);
    std::vector<int32_t> t(N);
    for (int n = 0; n < N; ++n) t[n] = (n * 7919) % V;
    double copy_ms = median_ms(reps, [&] { be->copy(logits.data(), logits0.data(), logits0.size() * 4); });
    double ms = median_ms(reps, [&] {
      be->copy(logits.data(), logits0.data(), logits0.size() * 4);
      be->crossentropy_forward(losses.data(), logits.data(), t.data(), N, V, Vp, 1.0f / N);
    });
    std::printf("crossentropy fwd+bwd N=%d V=%d Vp=%d: %.2f ms (excl. %.2f ms input copy)\n", N, V,
                Vp, ms - copy_ms, copy_ms);
  }
  {  // layernorm at N=1024, C=768
    const int N = 1024, C = 768;
    auto x = randv(size_t(N) * C, -2, 4, 4), w = randv(C, 0.5, 1.5, 5), b = randv(C, -1, 1, 6);
    auto dout = randv(size_t(N) * C, -1, 1, 7);
    std::vector<float> out(x.size()), mean(N), rstd(N), dinp(x.size()), dw(C), db(C);
    std::printf("layernorm N=%d C=%d: fwd %.3f ms, bwd input %.3f ms, bwd weight %.3f ms\n", N, C,
                median_ms(reps, [&] {
                  be->layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(),
                                        b.data(), N, C, 1e-5f);
                }),
                median_ms(reps, [&] {
                  be->layernorm_backward_input(dinp.data(), dout.data(), x.data(), w.data(),
                                               mean.data(), rstd.data(), N, C);
                }),
                median_ms(reps, [&] {
                  be->layernorm_backward_weight(dw.data(), db.data(), dout.data(), x.data(),
                                                mean.data(), rstd.data(), N, C);
                }));
  }
  {  // GELU on N x 4C
    const size_t n = size_t(1024) * 3072;
    auto x = randv(n, -4, 4, 8), d = randv(n, -1, 1, 9);
    std::vector<float> out(n);
    std::printf("gelu n=%zu: fwd %.3f ms, bwd %.3f ms\n", n,
                median_ms(reps, [&] { be->gelu_forward(out.data(), x.data(), n); }),
                median_ms(reps, [&] { be->gelu_backward(out.data(), x.data(), d.data(), n); }));
  }
  {  // attention, B=4 T=256 C=768 NH=12 (causal flops: ~half of 4*B*T*T*C per pass)
    const int B = 4, T = 256, C = 768, NH = 12;
    auto qkv = randv(size_t(B) * T * 3 * C, -1, 1, 10), dout = randv(size_t(B) * T * C, -1, 1, 11);
    std::vector<float> out(size_t(B) * T * C), dqkv(qkv.size());
    auto pool = pipetrain::MemoryPool::create(*be);
    std::unique_ptr<pipetrain::AttentionStash> stash;
    const double f = median_ms(reps, [&] {
      stash = be->attention_forward(out.data(), qkv.data(), B, T, C, NH, NH, *pool, pipetrain::DType::F32);
    });
    const double bw = median_ms(reps, [&] {
      be->attention_backward(dqkv.data(), dout.data(), qkv.data(), *stash, B, T, C, NH, NH, *pool);
    });
    std::printf("attention B=%d T=%d C=%d NH=%d: fwd %.3f ms, bwd %.3f ms\n", B, T, C, NH, f, bw);
    // bf16 storage: the probabilities kept in bf16; on a CPU with bf16 products (oneDNN) every
    // product of bf16 operands (PIPETRAIN_BF16_GEMM=sgemm: f32 products, P cast to bf16 and
    // back). qkv holds bf16 values, as a block passes it.
    for (float& x : qkv) x = pipetrain::to_float(pipetrain::to_bf16(x));
    const double f16 = median_ms(reps, [&] {
      stash = be->attention_forward(out.data(), qkv.data(), B, T, C, NH, NH, *pool, pipetrain::DType::BF16);
    });
    const double bw16 = median_ms(reps, [&] {
      be->attention_backward(dqkv.data(), dout.data(), qkv.data(), *stash, B, T, C, NH, NH, *pool);
    });
    // The backward as a block runs it: from qkv as stored (bf16), against widening it first
    // (what blocks did before the bf16-qkv form: a cast pass, then the f32 form).
    std::vector<pipetrain::bf16> stored(qkv.size());
    for (size_t i = 0; i < qkv.size(); ++i) stored[i] = pipetrain::to_bf16(qkv[i]);
    const double bw16_stored = median_ms(reps, [&] {
      be->attention_backward(dqkv.data(), dout.data(), stored.data(), *stash, B, T, C, NH, NH, *pool);
    });
    std::vector<float> widened(qkv.size());
    const double bw16_widened = median_ms(reps, [&] {
      be->cast_to_f32(widened.data(), stored.data(), stored.size());
      be->attention_backward(dqkv.data(), dout.data(), widened.data(), *stash, B, T, C, NH, NH, *pool);
    });
    std::printf("attention, bf16 storage (%s): fwd %.3f ms, bwd %.3f ms; bwd from the stored bf16 qkv %.3f ms, "
                "widening it first %.3f ms\n",
                pipetrain::bf16_products() == pipetrain::Bf16Products::kOnednn ? "bf16 products" : "f32 products",
                f16, bw16, bw16_stored, bw16_widened);
  }
  {  // AdamW over 16M parameters
    const size_t n = size_t(1) << 24;
    auto p = randv(n, -1, 1, 12), g = randv(n, -1, 1, 13);
    std::vector<float> m(n, 0.0f), v(n, 0.0f);
    int step = 0;
    const double ms = median_ms(reps, [&] {
      be->adamw(p.data(), g.data(), m.data(), v.data(), n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, ++step,
                1.0f);
    });
    std::printf("adamw n=%zu: %.2f ms (%.2f ns/param)\n", n, ms, ms * 1e6 / double(n));
    double ss = 0.0;
    bool fin = true;
    std::printf("sum_squares: %.2f ms, all_finite: %.2f ms, accumulate: %.2f ms (n=%zu)\n",
                median_ms(reps, [&] { ss += be->sum_squares(g.data(), n); }),
                median_ms(reps, [&] { fin = fin && be->all_finite(g.data(), n); }),
                median_ms(reps, [&] { be->accumulate(m.data(), g.data(), n); }), n);
    if (!fin || ss < 0) std::printf("(unexpected reduction results)\n");
  }
  {  // zeroing GPT-2 124M's gradients, as every step begins: the backend's fill against libc's memset
    const size_t n = size_t(124) << 20;
    std::vector<float> g(n, 1.0f);
    const double f = median_ms(reps, [&] { be->fill(g.data(), 0.0f, n); });
    const double m = median_ms(reps, [&] { std::memset(g.data(), 0, n * sizeof(float)); });
    std::printf("fill n=%zu (zeroing a step's gradients): %.2f ms (%.1f GB/s), memset %.2f ms (%.1f GB/s)\n", n, f,
                double(n) * 4 / f / 1e6, m, double(n) * 4 / m / 1e6);
  }
  return 0;
}
