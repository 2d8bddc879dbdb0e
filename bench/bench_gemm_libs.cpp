// bench_gemm_libs: a dense layer's three training products at GPT-2 124M shapes through
// the CBLAS pipetrain runs (OpenBLAS) and through oneDNN's f32 matmul, with the weight
// read in place (plain strides) and with the weight reordered once into the primitive's
// own blocked layout (what a weight copy refreshed after each update would give; the
// reorder's cost is printed, since it recurs every step). A product's runs alternate
// between the libraries, so both see the same moment of a shared machine; medians.
// What it answers: at a pipeline's small microbatches, how much of the products' time is
// the library packing the weight on every call, and how many microbatches a step needs
// before a reordered copy pays for itself. With --precision bf16 the two oneDNN columns
// multiply bf16 operands (what train.precision = "bf16" runs where oneDNN multiplies bf16
// natively; OpenBLAS has no bf16 product and stays the f32 reference point).
//
//   bench_gemm_libs [--rows 128,1024] [--reps 5] [--precision fp32|bf16]
#include <cblas.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <fmt/format.h>
#include <functional>
#include <optional>
#include <random>
#include <vector>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/backend/bf16_products.hpp"
#include "pipetrain/backend/blas_kernel.hpp"
#include "pipetrain/core/dtype.hpp"
#include "pipetrain/core/runtime_env.hpp"

#ifdef PIPETRAIN_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace {

using Clock = std::chrono::steady_clock;

struct Dense {
  const char* name;
  int in, out;
};
// GPT-2 124M's dense layers; the head is the tied 50304-row table.
constexpr Dense kLayers[] = {{"qkv", 768, 2304}, {"attn proj", 768, 768}, {"fc", 768, 3072},
                             {"fc proj", 3072, 768}, {"head", 768, 50304}};

// A layer's product, row-major as the layers call it: forward y = x W^T (NT), the input's
// gradient dx = dy W (NN), the weight's gradient dW += dy^T x (TN, beta = 1).
struct Product {
  const char* what;
  bool ta, tb;
  int M, N, K, lda, ldb;
  float beta;
  bool weight_is_b;  // B is the layer's weight (forward and dx): a reordered copy can stand in
  bool a_is_dy;      // A is the output's gradient (dx and dW), else the input
};

std::vector<Product> products(const Dense& d, int rows) {
  return {{"forward", false, true, rows, d.out, d.in, d.in, d.in, 0.0f, true, false},
          {"dx", false, false, rows, d.in, d.out, d.out, d.in, 0.0f, true, true},
          {"dW", true, false, d.out, d.in, rows, d.out, d.in, 1.0f, false, true}};
}

std::vector<float> random_values(size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(g);
  return v;
}

double seconds(const std::function<void()>& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  pipetrain::select_blas_kernel(argv);  // as pipetrain: a fallback OpenBLAS kernel is replaced first
  std::vector<int> row_counts = {128, 1024};
  int reps = 5;
  CLI::App app{"a dense layer's products through OpenBLAS and oneDNN at GPT-2 124M shapes"};
  app.add_option("--rows", row_counts, "tokens per microbatch (rows of the activations)")->delimiter(',');
  app.add_option("--reps", reps, "timed runs of each product and library (after one warm-up)")
      ->check(CLI::PositiveNumber);
  std::string precision = "fp32";
  app.add_option("--precision", precision, "oneDNN's operands: fp32, or bf16 (f32 sums)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  CLI11_PARSE(app, argc, argv);
  pipetrain::set_blas_threads(1);
  fmt::print("BLAS {}, 1 thread\n", pipetrain::blas_kernel_name());
#ifndef PIPETRAIN_HAVE_ONEDNN
  fmt::print("built without oneDNN: nothing to compare\n");
  return 0;
#else
  pipetrain::set_onednn_threads(1);
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const bool bf16 = precision == "bf16";
  const dt operand = bf16 ? dt::bf16 : dt::f32;
  fmt::print("oneDNN operands: {}\n", precision);
  // oneDNN's operand: the f32 values themselves, or a bf16 copy of them.
  auto operand_of = [&](const std::vector<float>& v) {
    std::vector<pipetrain::bf16> h;
    if (bf16)
      for (float f : v) h.push_back(pipetrain::to_bf16(f));
    return h;
  };
  for (const int rows : row_counts) {
    double sum_blas = 0, sum_plain = 0, sum_packed = 0, sum_blas_w = 0, sum_plain_w = 0, reorder_total = 0;
    fmt::print("\n{} rows (tokens per microbatch); ms per product, GFLOP/s, oneDNN time / OpenBLAS time\n", rows);
    fmt::print("{:<10} {:<8} {:>16} {:>24} {:>24} {:>10} {:>10}\n", "layer", "product", "OpenBLAS",
               "oneDNN, weight in place", "oneDNN, weight reordered", "reorder", "max diff");
    for (const Dense& d : kLayers) {
      const auto x = random_values(static_cast<size_t>(rows) * d.in, 1);
      const auto dy = random_values(static_cast<size_t>(rows) * d.out, 2);
      const auto w = random_values(static_cast<size_t>(d.in) * d.out, 3);
      const auto x_h = operand_of(x), dy_h = operand_of(dy), w_h = operand_of(w);
      for (const Product& p : products(d, rows)) {
        const float* A = p.a_is_dy ? dy.data() : x.data();
        const float* B = p.weight_is_b ? w.data() : x.data();
        const void* A_op = !bf16 ? static_cast<const void*>(A) : (p.a_is_dy ? dy_h.data() : x_h.data());
        const void* B_op = !bf16 ? static_cast<const void*>(B) : (p.weight_is_b ? w_h.data() : x_h.data());
        std::vector<float> c_blas(static_cast<size_t>(p.M) * p.N), c_plain(c_blas.size()), c_packed(c_blas.size());
        const dnnl::memory::desc a({p.M, p.K}, operand, p.ta ? dims{1, p.lda} : dims{p.lda, 1});
        const dnnl::memory::desc b({p.K, p.N}, operand, p.tb ? dims{1, p.ldb} : dims{p.ldb, 1});
        const dnnl::memory::desc c({p.M, p.N}, dt::f32, dims{p.N, 1});
        dnnl::primitive_attr attr;
        if (p.beta != 0.0f) {
          dnnl::post_ops ops;
          ops.append_sum(p.beta);
          attr.set_post_ops(ops);
        }
        auto mem = [&](const dnnl::memory::desc& md, const void* ptr) {
          return dnnl::memory(md, engine, const_cast<void*>(ptr));
        };
        const dnnl::matmul::primitive_desc plain_pd(dnnl::matmul::desc(a, b, c), attr, engine);
        const dnnl::matmul plain(plain_pd);
        std::optional<dnnl::matmul> packed;
        std::optional<dnnl::memory> packed_w;
        double reorder_s = 0;
        if (p.weight_is_b) {
          const dnnl::memory::desc any({p.K, p.N}, operand, dnnl::memory::format_tag::any);
          const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, any, c), attr, engine);
          packed.emplace(pd);
          packed_w.emplace(pd.weights_desc(), engine);
          dnnl::memory src = mem(b, B_op);
          std::vector<double> t;
          for (int r = 0; r <= reps; ++r)
            t.push_back(seconds([&] {
              dnnl::reorder(src, *packed_w).execute(stream, src, *packed_w);
              stream.wait();
            }));
          reorder_s = median(t);
        }
        std::vector<double> tb, tp, tk;
        for (int r = 0; r <= reps; ++r) {  // the first round warms up (and builds the JIT kernels)
          const double b_s = seconds([&] {
            cblas_sgemm(CblasRowMajor, p.ta ? CblasTrans : CblasNoTrans, p.tb ? CblasTrans : CblasNoTrans, p.M, p.N,
                        p.K, 1.0f, A, p.lda, B, p.ldb, p.beta, c_blas.data(), p.N);
          });
          const double p_s = seconds([&] {
            plain.execute(stream, {{DNNL_ARG_SRC, mem(a, A_op)}, {DNNL_ARG_WEIGHTS, mem(b, B_op)},
                                   {DNNL_ARG_DST, mem(c, c_plain.data())}});
            stream.wait();
          });
          const double k_s = !packed ? 0.0 : seconds([&] {
            packed->execute(stream, {{DNNL_ARG_SRC, mem(a, A_op)}, {DNNL_ARG_WEIGHTS, *packed_w},
                                     {DNNL_ARG_DST, mem(c, c_packed.data())}});
            stream.wait();
          });
          if (r > 0) tb.push_back(b_s), tp.push_back(p_s), tk.push_back(k_s);
        }
        // beta = 1 accumulated reps + 1 times into each result alike; the forward and dx overwrite.
        double diff = 0;
        for (size_t i = 0; i < c_blas.size(); ++i) {
          const double ref = c_blas[i];
          diff = std::max(diff, std::abs(ref - c_plain[i]) / (1.0 + std::abs(ref)));
          if (packed) diff = std::max(diff, std::abs(ref - c_packed[i]) / (1.0 + std::abs(ref)));
        }
        const double flop = 2.0 * p.M * p.N * p.K, mb = median(tb), mp = median(tp), mk = median(tk);
        sum_blas += mb;
        sum_plain += mp;
        if (packed) {
          sum_blas_w += mb;
          sum_plain_w += mp;
          sum_packed += mk;
          reorder_total += reorder_s;
        }
        auto cell = [&](double s) { return fmt::format("{:7.2f} {:6.1f}", s * 1e3, flop / s / 1e9); };
        fmt::print("{:<10} {:<8} {:>16} {:>16} {:>7.3f} {:>16} {:>7} {:>10} {:>10.1e}\n", d.name, p.what, cell(mb),
                   cell(mp), mp / mb, packed ? cell(mk) : "—", packed ? fmt::format("{:.3f}", mk / mb) : "",
                   packed ? fmt::format("{:.2f}", reorder_s * 1e3) : "", diff);
      }
    }
    fmt::print("all products: OpenBLAS {:.1f} ms, oneDNN with the weight in place {:.1f} ms ({:.3f})\n",
               sum_blas * 1e3, sum_plain * 1e3, sum_plain / sum_blas);
    // The reordered weights against what pipetrain runs without them: OpenBLAS in f32,
    // oneDNN reading the weight in place in bf16.
    const double base = bf16 ? sum_plain_w : sum_blas_w, gain = base - sum_packed;
    fmt::print("{}forward and dx: {} {:.1f} ms, {} {:.1f} ms ({:.3f}); the reorders {:.1f} ms per update: {}\n",
               bf16 ? "bf16 " : "", bf16 ? "oneDNN with the weight in place" : "OpenBLAS", base * 1e3,
               bf16 ? "reordered" : "oneDNN with reordered weights", sum_packed * 1e3, sum_packed / base,
               reorder_total * 1e3,
               gain > 0 ? fmt::format("they pay for themselves from {:.1f} microbatches per step", reorder_total / gain)
                        : std::string("they never pay for themselves"));
  }
  return 0;
#endif
}
