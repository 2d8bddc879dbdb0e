// check_sgemm of pipetrain/backend/blas_self_check.hpp.
#include "pipetrain/backend/blas_self_check.hpp"

#include <fmt/format.h>

#include <cmath>
#include <random>
#include <vector>

namespace pipetrain {

namespace {

struct Case {
  int M, N, K;
  float alpha, beta;
  int pad;  // added to every leading dimension
};

// Shapes below, at and past the blocking of the kernels OpenBLAS ships (register tiles of
// 4-16 rows and columns, cache blocks of 96-512), with edges that leave partial tiles.
const Case kCases[] = {
    {1, 1, 1, 1.0f, 0.0f, 0},     {3, 5, 7, 1.0f, 0.0f, 1},      {16, 16, 16, 1.0f, 1.0f, 0},
    {17, 33, 65, -0.5f, 1.0f, 3}, {64, 48, 1, 1.0f, 0.0f, 0},    {127, 129, 255, 1.0f, 0.0f, 2},
    {8, 8, 3001, 1.0f, 0.0f, 0},  {200, 3, 96, 2.0f, 0.5f, 1},   {2, 300, 40, 1.0f, 1.0f, 0},
    {257, 191, 520, 1.0f, 1.0f, 5},
};

// C = alpha op(A) op(B) + beta C in double, and each element's bound.
void reference(const Case& c, bool ta, bool tb, const std::vector<float>& A, int lda, const std::vector<float>& B,
               int ldb, const std::vector<float>& C0, int ldc, std::vector<double>& want, std::vector<double>& bound) {
  constexpr double u = 0x1p-24;
  for (int i = 0; i < c.M; ++i)
    for (int j = 0; j < c.N; ++j) {
      double sum = 0, abs_sum = 0;
      for (int k = 0; k < c.K; ++k) {
        const double a = ta ? A[static_cast<size_t>(k) * lda + i] : A[static_cast<size_t>(i) * lda + k];
        const double b = tb ? B[static_cast<size_t>(j) * ldb + k] : B[static_cast<size_t>(k) * ldb + j];
        sum += a * b;
        abs_sum += std::abs(a * b);
      }
      const double c0 = C0[static_cast<size_t>(i) * ldc + j];
      want[static_cast<size_t>(i) * c.N + j] = c.alpha * sum + c.beta * c0;
      bound[static_cast<size_t>(i) * c.N + j] =
          (c.K + 2) * u * (std::abs(c.alpha) * abs_sum + std::abs(c.beta * c0)) + 1e-30;
    }
}

}  // namespace

ProductCheck check_sgemm(const SgemmFn& sgemm) {
  ProductCheck r;
  std::mt19937 gen(20261207);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (const Case& c : kCases)
    for (const bool ta : {false, true})
      for (const bool tb : {false, true}) {
        const int lda = (ta ? c.M : c.K) + c.pad, ldb = (tb ? c.K : c.N) + c.pad, ldc = c.N + c.pad;
        std::vector<float> A(static_cast<size_t>(ta ? c.K : c.M) * lda), B(static_cast<size_t>(tb ? c.N : c.K) * ldb),
            C(static_cast<size_t>(c.M) * ldc);
        for (auto* v : {&A, &B, &C})
          for (float& x : *v) x = value(gen);
        const std::vector<float> C0 = C;
        std::vector<double> want(static_cast<size_t>(c.M) * c.N), bound(want.size());
        reference(c, ta, tb, A, lda, B, ldb, C0, ldc, want, bound);
        sgemm(ta, tb, c.M, c.N, c.K, c.alpha, A.data(), lda, B.data(), ldb, c.beta, C.data(), ldc);
        ++r.products;
        for (int i = 0; i < c.M; ++i) {
          for (int j = 0; j < c.N; ++j) {
            const size_t e = static_cast<size_t>(i) * c.N + j;
            const double got = C[static_cast<size_t>(i) * ldc + j];
            const double ratio = std::isfinite(got) ? std::abs(got - want[e]) / bound[e] : INFINITY;
            r.worst = std::max(r.worst, ratio);
            if (ratio > 1 && r.failure.empty())
              r.failure = fmt::format("{}x{}x{} {}{} alpha {} beta {}: C[{},{}] = {} against {} (bound {:.2g})", c.M,
                                      c.N, c.K, ta ? 'T' : 'N', tb ? 'T' : 'N', c.alpha, c.beta, i, j, got, want[e],
                                      bound[e]);
          }
          // The padding beyond each row's N columns must be left as it was.
          for (int j = c.N; j < ldc; ++j)
            if (C[static_cast<size_t>(i) * ldc + j] != C0[static_cast<size_t>(i) * ldc + j] && r.failure.empty())
              r.failure = fmt::format("{}x{}x{} {}{}: wrote C[{},{}], past its {} columns", c.M, c.N, c.K,
                                      ta ? 'T' : 'N', tb ? 'T' : 'N', i, j, c.N);
        }
      }
  r.passed = r.failure.empty();
  return r;
}

}  // namespace pipetrain
