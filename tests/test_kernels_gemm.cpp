// Kernel harness for the matrix products: gemm (every transpose, both betas, padded
// leading dimensions), gemm_bias (a dense layer's output with its bias and residual),
// the bf16 products and their epilogues, and the strided batch, each against the double
// reference of kernel_reference.hpp on every backend present.
#include <gtest/gtest.h>

#include <vector>

#include "kernel_backends.hpp"
#include "kernel_reference.hpp"
#include "pipetrain/backend/backend.hpp"
#include "pipetrain/backend/bf16_products.hpp"
#include "pipetrain/core/dtype.hpp"
#include "pipetrain/core/error.hpp"

namespace pipetrain {
namespace {

using ref::random_vec;
using ref::Vec;
using testing::close;
using testing::DevBuf;

class KernelGemmTest : public testing::BackendTest {};
INSTANTIATE_TEST_SUITE_P(Backends, KernelGemmTest, ::testing::ValuesIn(testing::backend_factories()),
                         testing::factory_name);

TEST_P(KernelGemmTest, Gemm) {
  const int M = 37, N = 29, K = 53;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const int lda = (ta ? M : K) + 5, ldb = (tb ? K : N) + 3, ldc = N + 7;
      const Vec A = random_vec(size_t(ta ? K : M) * lda, 1);
      const Vec B = random_vec(size_t(tb ? N : K) * ldb, 2);
      const Vec C0 = random_vec(size_t(M) * ldc, 3);
      for (float beta : {0.0f, 0.3f}) {
        Vec want(C0);
        ref::gemm(ta, tb, M, N, K, 0.7, A.data(), lda, B.data(), ldb, beta, C0.data(),
                  want.data(), ldc);
        DevBuf<float> a(be(), A), b(be(), B), c(be(), C0);
        be().gemm(ta, tb, M, N, K, 0.7f, a.get(), lda, b.get(), ldb, beta, c.get(), ldc);
        EXPECT_TRUE(close(c.host(), want, 1e-5, 1e-5)) << "ta=" << ta << " tb=" << tb
                                                       << " beta=" << beta;
      }
    }
  }
}

// A dense layer's output with its bias and residual in one call, each optional, against
// the double reference (the same 1e-5 bound as the product alone: the two additions
// change the f32 result by a few units of its last place). Only the M x N block is
// written: C's padding columns keep what they held.
TEST_P(KernelGemmTest, GemmBiasResidual) {
  const int M = 37, N = 29, K = 53;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const int lda = (ta ? M : K) + 5, ldb = (tb ? K : N) + 3, ldc = N + 7;
      const Vec A = random_vec(size_t(ta ? K : M) * lda, 21), B = random_vec(size_t(tb ? N : K) * ldb, 22);
      const Vec C0 = random_vec(size_t(M) * ldc, 23), bias = random_vec(size_t(N), 24),
                R = random_vec(size_t(M) * ldc, 25);
      DevBuf<float> a(be(), A), b(be(), B), bb(be(), bias), r(be(), R);
      for (bool with_bias : {false, true})
        for (bool with_residual : {false, true}) {
          Vec want(C0);
          ref::gemm(ta, tb, M, N, K, 1.0, A.data(), lda, B.data(), ldb, 0.0, C0.data(), want.data(), ldc);
          for (int i = 0; i < M; ++i)
            for (int j = 0; j < N; ++j) {
              const size_t k = size_t(i) * ldc + j;
              want[k] = static_cast<float>(double(want[k]) + (with_bias ? bias[j] : 0.0) + (with_residual ? R[k] : 0.0));
            }
          DevBuf<float> c(be(), C0);
          be().gemm_bias(ta, tb, M, N, K, a.get(), lda, b.get(), ldb, c.get(), ldc, with_bias ? bb.get() : nullptr,
                         with_residual ? r.get() : nullptr);
          EXPECT_TRUE(close(c.host(), want, 1e-5, 1e-5))
              << "ta=" << ta << " tb=" << tb << " bias=" << with_bias << " residual=" << with_residual;
        }
    }
}

// bf16 operands, f32 accumulation and output: against the double reference on the
// rounded operands, within the f32 gemm's bound (the rounding is the caller's; what the
// kernel adds is f32 summation, K * 2^-24 relative per term, far below 1e-5 at K = 53).
// The epilogues: the bias added to every row, and GELU of the biased product with the
// product kept (GELU within 1e-4: a GPU epilogue may evaluate tanh in fast arithmetic;
// the result is stored in bf16, whose step is 2^-8).
TEST_P(KernelGemmTest, GemmBf16AndItsEpilogues) {
  const int M = 37, N = 29, K = 53;
  const long onednn_before = onednn_products_run();
  auto rounded = [](const Vec& v, std::vector<bf16>* out) {
    Vec r(v.size());
    out->resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      (*out)[i] = to_bf16(v[i]);
      r[i] = to_float((*out)[i]);
    }
    return r;
  };
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const int lda = (ta ? M : K) + 5, ldb = (tb ? K : N) + 3, ldc = N + 7;
      std::vector<bf16> A16, B16;
      const Vec A = rounded(random_vec(size_t(ta ? K : M) * lda, 11), &A16);
      const Vec B = rounded(random_vec(size_t(tb ? N : K) * ldb, 12), &B16);
      const Vec C0 = random_vec(size_t(M) * ldc, 13), bias = random_vec(size_t(N), 14);
      DevBuf<bf16> a(be(), A16), b(be(), B16);
      for (float beta : {0.0f, 0.3f}) {
        Vec want(C0);
        ref::gemm(ta, tb, M, N, K, 0.7, A.data(), lda, B.data(), ldb, beta, C0.data(), want.data(), ldc);
        DevBuf<float> c(be(), C0);
        be().gemm_bf16(ta, tb, M, N, K, 0.7f, a.get(), lda, b.get(), ldb, beta, c.get(), ldc);
        EXPECT_TRUE(close(c.host(), want, 1e-5, 1e-5)) << "ta=" << ta << " tb=" << tb << " beta=" << beta;
      }
      Vec biased(C0), gelu(C0);
      ref::gemm(ta, tb, M, N, K, 1.0, A.data(), lda, B.data(), ldb, 0.0, C0.data(), biased.data(), ldc);
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
          const size_t k = size_t(i) * ldc + j;
          biased[k] += bias[j];
          gelu[k] = static_cast<float>(ref::gelu(biased[k]));
        }
      DevBuf<float> bb(be(), bias), c(be(), C0), pre(be(), C0);
      be().gemm_bf16(ta, tb, M, N, K, 1.0f, a.get(), lda, b.get(), ldb, 0.0f, c.get(), ldc, Backend::Epilogue::kBias,
                     bb.get());
      EXPECT_TRUE(close(c.host(), biased, 1e-5, 1e-5)) << "bias ta=" << ta << " tb=" << tb;
      DevBuf<float> g(be(), C0);
      be().gemm_bf16(ta, tb, M, N, K, 1.0f, a.get(), lda, b.get(), ldb, 0.0f, g.get(), ldc,
                     Backend::Epilogue::kBiasGelu, bb.get(), pre.get());
      // Only the M x N block is written: the padding columns of ldc keep C0.
      EXPECT_TRUE(close(pre.host(), biased, 1e-5, 1e-5)) << "pre-GELU ta=" << ta << " tb=" << tb;
      EXPECT_TRUE(close(g.host(), gelu, 1e-4, 1e-4)) << "GELU ta=" << ta << " tb=" << tb;
    }
  // The oneDNN backend ran every one of the 16 products itself (none widened).
  const bool onednn = be().name().find("bf16 products: oneDNN") != std::string::npos;
  EXPECT_EQ(onednn_products_run() - onednn_before, onednn ? 16 : 0) << be().name();
  DevBuf<bf16> a(be(), std::vector<bf16>(4)), b(be(), std::vector<bf16>(4));
  DevBuf<float> c(be(), Vec(4));
  EXPECT_THROW(be().gemm_bf16(false, false, 2, 2, 2, 1.0f, a.get(), 2, b.get(), 2, 1.0f, c.get(), 2,
                              Backend::Epilogue::kBias, nullptr),
               Error);
}

TEST_P(KernelGemmTest, GemmStridedBatched) {
  const int M = 19, N = 23, K = 17, batch = 3;
  const long sa = 17L * 19 + 11, sb = 23L * 17 + 5, sc = 19L * 25 + 3;  // A^T: K x M, ldc 25
  const Vec A = random_vec(sa * batch, 4), B = random_vec(sb * batch, 5),
            C0 = random_vec(sc * batch, 6);
  Vec want(C0);
  for (int i = 0; i < batch; ++i) {
    ref::gemm(true, false, M, N, K, 1.5, A.data() + i * sa, M, B.data() + i * sb, N, -0.5,
              C0.data() + i * sc, want.data() + i * sc, 25);
  }
  DevBuf<float> a(be(), A), b(be(), B), c(be(), C0);
  be().gemm_strided_batched(true, false, M, N, K, 1.5f, a.get(), M, sa, b.get(), N, sb, -0.5f,
                            c.get(), 25, sc, batch);
  EXPECT_TRUE(close(c.host(), want, 1e-5, 1e-5));
}

}  // namespace
}  // namespace pipetrain
