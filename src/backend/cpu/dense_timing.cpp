// time_dense_products of cpu_kernels.hpp: one weight shape's three products on each path
// this build has, timed as a training step runs them, for the choice of
// plan/product_choice.hpp. Each product is timed once, its library warmed up first on small
// operands; the reorders (one per layout) are what a packed product's first calls in a step
// add to its later ones. (Under 1 s at GPT-2 124M's shapes on one core of 90 GFLOP/s; once
// per run directory.)
#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

#include "cpu_kernels.hpp"

namespace pipetrain::cpu {

namespace {

double seconds_of(const std::function<void()>& run) {
  const auto t = std::chrono::steady_clock::now();
  run();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

std::vector<float> values(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>(static_cast<int>(i * 2654435761u % 2001) - 1000) / 1000;
  return v;
}

// The three products of `lib` on small operands: oneDNN generates its kernels for each
// transpose here, not inside a timed product.
void warm_up(ProductLibrary lib) {
  constexpr int n = 64;
  const auto a = values(n * n, 1.0f);
  std::vector<float> c(n * n);
  for (const auto& [ta, tb] : {std::pair{false, true}, std::pair{false, false}, std::pair{true, false}})
    gemm_in(lib, ta, tb, n, n, n, 1.0f, a.data(), n, a.data(), n, 1.0f, c.data(), n);
}

}  // namespace

DenseProductTimes time_dense_products(DenseShape shape, int rows) {
  const int out = shape.out, in = shape.in;
  // Every operand written before the first product: no page is first touched inside one.
  const auto x = values(static_cast<size_t>(rows) * in, 1.0f), w = values(static_cast<size_t>(out) * in, 0.05f),
             dy = values(static_cast<size_t>(rows) * out, 0.01f);
  std::vector<float> y(static_cast<size_t>(rows) * out, 0.0f), dx(static_cast<size_t>(rows) * in, 0.0f),
      dw(static_cast<size_t>(out) * in, 0.0f);
  DenseProductTimes t;
  t.shape = shape;
  t.rows = rows;
  auto time_library = [&](ProductLibrary lib) {
    warm_up(lib);
    return std::array<double, 3>{
        seconds_of([&] { gemm_in(lib, false, true, rows, out, in, 1.0f, x.data(), in, w.data(), in, 0.0f, y.data(), out); }),
        seconds_of([&] { gemm_in(lib, false, false, rows, in, out, 1.0f, dy.data(), out, w.data(), in, 0.0f, dx.data(), in); }),
        seconds_of([&] { gemm_in(lib, true, false, out, in, rows, 1.0f, dy.data(), out, x.data(), in, 1.0f, dw.data(), in); })};
  };
  t.blas = time_library(ProductLibrary::Blas);
  if (onednn_built_in()) t.onednn = time_library(ProductLibrary::Onednn);
  if (auto packed = PackedDense::make()) {
    // A hold's first forward and input gradient reorder W into each one's layout (the
    // primitives made by an untimed hold first); the same products again do not.
    auto forward = [&] { return packed->forward(rows, out, in, x.data(), w.data(), y.data(), nullptr, nullptr); };
    auto input_gradient = [&] { return packed->backward_input(rows, out, in, dy.data(), w.data(), dx.data()); };
    packed->hold(true);
    if (forward() && input_gradient()) {
      packed->hold(false);
      packed->hold(true);
      const double first = seconds_of([&] { forward(), input_gradient(); });
      t.packed = {seconds_of(forward), seconds_of(input_gradient)};
      t.reorder = std::max(0.0, first - t.packed[0] - t.packed[1]);
    }
    packed->hold(false);
  }
  return t;
}

}  // namespace pipetrain::cpu
