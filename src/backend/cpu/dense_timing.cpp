// time_dense_products of cpu_kernels.hpp: one weight shape's three products on each path
// this build has, timed as a training step runs them, for the choice of
// plan/product_choice.hpp. Each product runs once to warm up (oneDNN generates its kernel,
// the BLAS allocates its buffers) and then twice, the faster counting; the reorders (one per
// layout) are what a packed product's first calls in a step add to its later ones.
#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

#include "cpu_kernels.hpp"

namespace pipetrain::cpu {

namespace {

double seconds_of(const std::function<void()>& run, int reps = 2) {
  run();
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    const auto t = std::chrono::steady_clock::now();
    run();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count());
  }
  return best;
}

std::vector<float> values(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>(static_cast<int>(i * 2654435761u % 2001) - 1000) / 1000;
  return v;
}

}  // namespace

DenseProductTimes time_dense_products(DenseShape shape, int rows) {
  const int out = shape.out, in = shape.in;
  const auto x = values(static_cast<size_t>(rows) * in, 1.0f), w = values(static_cast<size_t>(out) * in, 0.05f),
             dy = values(static_cast<size_t>(rows) * out, 0.01f);
  std::vector<float> y(static_cast<size_t>(rows) * out), dx(static_cast<size_t>(rows) * in),
      dw(static_cast<size_t>(out) * in, 0.0f);
  DenseProductTimes t;
  t.shape = shape;
  t.rows = rows;
  auto time_library = [&](ProductLibrary lib) {
    return std::array<double, 3>{
        seconds_of([&] { gemm_in(lib, false, true, rows, out, in, 1.0f, x.data(), in, w.data(), in, 0.0f, y.data(), out); }),
        seconds_of([&] { gemm_in(lib, false, false, rows, in, out, 1.0f, dy.data(), out, w.data(), in, 0.0f, dx.data(), in); }),
        seconds_of([&] { gemm_in(lib, true, false, out, in, rows, 1.0f, dy.data(), out, x.data(), in, 1.0f, dw.data(), in); })};
  };
  t.blas = time_library(ProductLibrary::Blas);
  if (onednn_built_in()) t.onednn = time_library(ProductLibrary::Onednn);
  if (auto packed = PackedDense::make()) {
    packed->hold(true);
    bool ran = packed->forward(rows, out, in, x.data(), w.data(), y.data(), nullptr, nullptr) &&
               packed->backward_input(rows, out, in, dy.data(), w.data(), dx.data());
    if (ran) {
      t.packed = {seconds_of([&] { packed->forward(rows, out, in, x.data(), w.data(), y.data(), nullptr, nullptr); }),
                  seconds_of([&] { packed->backward_input(rows, out, in, dy.data(), w.data(), dx.data()); })};
      // A new hold's first forward and input gradient reorder W again, into each one's
      // layout: those calls less two products' time.
      const double first = seconds_of(
          [&] {
            packed->hold(false);
            packed->hold(true);
            packed->forward(rows, out, in, x.data(), w.data(), y.data(), nullptr, nullptr);
            packed->backward_input(rows, out, in, dy.data(), w.data(), dx.data());
          },
          2);
      t.reorder = std::max(0.0, first - t.packed[0] - t.packed[1]);
    }
    packed->hold(false);
  }
  return t;
}

}  // namespace pipetrain::cpu
