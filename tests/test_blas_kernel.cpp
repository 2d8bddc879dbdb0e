// Kernel selection: which OpenBLAS core replaces the one running, for each instruction
// set (the re-execution itself is checked end to end by tests/cli/blas_kernel.sh).
#include <cblas.h>
#include <gtest/gtest.h>

#include <cmath>

#include "pipetrain/backend/bf16_products.hpp"
#include "pipetrain/backend/blas_kernel.hpp"
#include "pipetrain/backend/blas_self_check.hpp"
#include "pipetrain/backend/blas_threads.hpp"
#include "pipetrain/core/error.hpp"

namespace pipetrain {
namespace {

CpuIsa isa(int level, bool bf16 = false, bool amd = false) {
  CpuIsa i;
  i.avx = level >= 1;
  i.avx2_fma = level >= 2;
  i.avx512 = level >= 3;
  i.avx512_bf16 = bf16;
  i.amd = amd;
  return i;
}

TEST(BlasKernel, AFallbackIsReplacedByTheBestCoreForTheCpu) {
  EXPECT_EQ(better_openblas_core("Prescott", isa(3)), "SkylakeX");  // the Xeon model 207 case
  EXPECT_EQ(better_openblas_core("Prescott", isa(3, true)), "Cooperlake");
  EXPECT_EQ(better_openblas_core("Haswell", isa(3)), "SkylakeX");
  EXPECT_EQ(better_openblas_core("Sandybridge", isa(2)), "Haswell");
  EXPECT_EQ(better_openblas_core("Core2", isa(2, false, true)), "Zen");
  EXPECT_EQ(better_openblas_core("NEHALEM", isa(1)), "Sandybridge");  // OpenBLAS names are case-insensitive
}

TEST(BlasKernel, ARightOrUnknownCoreIsKept) {
  EXPECT_EQ(better_openblas_core("Cooperlake", isa(3, true)), "");
  EXPECT_EQ(better_openblas_core("SkylakeX", isa(3, true)), "");  // same level: OpenBLAS knows best
  EXPECT_EQ(better_openblas_core("Zen", isa(2, false, true)), "");
  EXPECT_EQ(better_openblas_core("Prescott", isa(0)), "");      // an SSE-only CPU
  EXPECT_EQ(better_openblas_core("SkylakeX", isa(2)), "");      // never "down"
  EXPECT_EQ(better_openblas_core("unknown", isa(3)), "");       // not OpenBLAS
  EXPECT_EQ(better_openblas_core("NEOVERSEN1", isa(0)), "");    // not x86
}

// bf16 products: oneDNN by default only where it runs bf16 natively; `onednn` also where
// it emulates, and an error where it cannot run at all; `sgemm` always; nothing else.
void cblas(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
           float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda,
              B, ldb, beta, C, ldc);
}

TEST(BlasSelfCheck, TheRunningKernelPasses) {
  const ProductCheck c = check_sgemm(cblas);
  EXPECT_TRUE(c.passed) << c.failure;
  EXPECT_EQ(c.products, 40);
  EXPECT_LE(c.worst, 1.0);
  EXPECT_GT(c.worst, 0.0);  // the bounds are not so loose that nothing registers
}

// The kinds of wrong product a miscompiled or misdetected kernel gives, each caught.
TEST(BlasSelfCheck, WrongProductsFailIt) {
  const std::vector<std::pair<const char*, SgemmFn>> wrong = {
      {"a transpose ignored on one shape",
       [](bool ta, bool tb, int M, int N, int K, float al, const float* A, int lda, const float* B, int ldb, float be,
          float* C, int ldc) { cblas(ta && M != K, tb, M, N, K, al, A, lda, B, ldb, be, C, ldc); }},
      {"beta treated as 0",
       [](bool ta, bool tb, int M, int N, int K, float al, const float* A, int lda, const float* B, int ldb, float,
          float* C, int ldc) { cblas(ta, tb, M, N, K, al, A, lda, B, ldb, 0.0f, C, ldc); }},
      {"the last partial tile's last column dropped",
       [](bool ta, bool tb, int M, int N, int K, float al, const float* A, int lda, const float* B, int ldb, float be,
          float* C, int ldc) {
         std::vector<float> keep(static_cast<size_t>(M));
         for (int i = 0; i < M; ++i) keep[i] = C[static_cast<size_t>(i) * ldc + N - 1];
         cblas(ta, tb, M, N, K, al, A, lda, B, ldb, be, C, ldc);
         if (N % 16 != 0)
           for (int i = 0; i < M; ++i) C[static_cast<size_t>(i) * ldc + N - 1] = keep[i];
       }},
      {"operands rounded to bf16 (a kernel taking a reduced-precision path)",
       [](bool ta, bool tb, int M, int N, int K, float al, const float* A, int lda, const float* B, int ldb, float be,
          float* C, int ldc) {
         std::vector<float> a(A, A + static_cast<size_t>(ta ? K : M) * lda);
         for (float& x : a) {
           int e = 0;
           x = std::ldexp(std::nearbyint(std::ldexp(std::frexp(x, &e), 8)), e - 8);  // 8 significant bits
         }
         cblas(ta, tb, M, N, K, al, a.data(), lda, B, ldb, be, C, ldc);
       }},
      {"written past N columns",
       [](bool ta, bool tb, int M, int N, int K, float al, const float* A, int lda, const float* B, int ldb, float be,
          float* C, int ldc) {
         cblas(ta, tb, M, N, K, al, A, lda, B, ldb, be, C, ldc);
         if (ldc > N) C[N] = 0.0f;
       }},
      {"a NaN", [](bool ta, bool tb, int M, int N, int K, float al, const float* A, int lda, const float* B, int ldb,
                   float be, float* C, int ldc) {
         cblas(ta, tb, M, N, K, al, A, lda, B, ldb, be, C, ldc);
         if (M * N > 10000) C[ldc + 1] = NAN;
       }},
  };
  for (const auto& [what, fn] : wrong) {
    const ProductCheck c = check_sgemm(fn);
    EXPECT_FALSE(c.passed) << what;
    EXPECT_FALSE(c.failure.empty()) << what;
  }
}

TEST(Bf16Products, OnednnOnlyWhereItRunsBf16Natively) {
  using P = Bf16Products;
  for (const char* policy : {"", "auto"}) {
    EXPECT_EQ(choose_bf16_products(policy, true, true), P::kOnednn);
    EXPECT_EQ(choose_bf16_products(policy, true, false), P::kSgemm);  // emulated bf16: not faster
    EXPECT_EQ(choose_bf16_products(policy, false, false), P::kSgemm);
  }
  EXPECT_EQ(choose_bf16_products("onednn", true, false), P::kOnednn);
  EXPECT_EQ(choose_bf16_products("sgemm", true, true), P::kSgemm);
  EXPECT_THROW(choose_bf16_products("onednn", false, false), Error);
  try {
    choose_bf16_products("mkl", true, true);
    FAIL() << "an unknown policy was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("PIPETRAIN_BF16_GEMM=mkl"), std::string::npos) << e.what();
  }
}

// Each rank runs its share of the CPUs it may run on, rounded down (never more threads
// than cores), never below one.
TEST(BlasThreads, EachRankTakesItsShareOfTheCpusItMayRunOn) {
  EXPECT_EQ(blas_threads_share(2, 2), 1);    // mpirun -np 2 without binding on 2 cores
  EXPECT_EQ(blas_threads_share(1, 1), 1);    // bound to one core
  EXPECT_EQ(blas_threads_share(64, 8), 8);   // 8 ranks bound to one 64-core socket
  EXPECT_EQ(blas_threads_share(64, 1), 64);  // one rank per socket
  EXPECT_EQ(blas_threads_share(2, 8), 1);    // more ranks than cores
  EXPECT_EQ(blas_threads_share(6, 4), 1);
  EXPECT_EQ(blas_threads_share(0, 1), 1);
}

}  // namespace
}  // namespace pipetrain
