// Kernel harness for the matrix products: gemm (every transpose, both betas, padded
// leading dimensions), gemm_bias (a dense layer's output with its bias and residual),
// the bf16 products and their epilogues, the grouped products and the strided batch, each against the double
// reference of kernel_reference.hpp on every backend present.
#include <gtest/gtest.h>

#include <iostream>
#include <memory>
#include <string>
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

// A dense layer's two products by its weight (dense_forward with and without its bias and
// residual, dense_backward_input) against the double reference, as sgemm and, where the
// backend packs weights (runtime.pack_weights), by the copy it keeps while they are held.
// A hold after the weight changed multiplies by the new values (the copy is made again),
// and products outside a hold read the weight as it stands. The bound is gemm's above.
TEST_P(KernelGemmTest, DenseProductsByAHeldWeight) {
  const int rows = 37, out = 29, in = 53;
  const Vec X = random_vec(size_t(rows) * in, 31), DY = random_vec(size_t(rows) * out, 32),
            bias = random_vec(size_t(out), 33), R = random_vec(size_t(rows) * out, 34);
  const Vec W1 = random_vec(size_t(out) * in, 35), W2 = random_vec(size_t(out) * in, 36);
  DevBuf<float> x(be(), X), dy(be(), DY), b(be(), bias), r(be(), R), w(be(), W1);
  auto check = [&](const Vec& W, const std::string& when) {
    for (bool with_bias : {false, true})
      for (bool with_residual : {false, true}) {
        Vec want(size_t(rows) * out);
        ref::gemm(false, true, rows, out, in, 1.0, X.data(), in, W.data(), in, 0.0, want.data(), want.data(), out);
        for (int i = 0; i < rows; ++i)
          for (int j = 0; j < out; ++j) {
            const size_t k = size_t(i) * out + j;
            want[k] = static_cast<float>(double(want[k]) + (with_bias ? bias[j] : 0.0) + (with_residual ? R[k] : 0.0));
          }
        DevBuf<float> y(be(), Vec(want.size(), 7.0f));
        be().dense_forward(rows, out, in, x.get(), w.get(), y.get(), with_bias ? b.get() : nullptr,
                           with_residual ? r.get() : nullptr);
        EXPECT_TRUE(close(y.host(), want, 1e-5, 1e-5)) << when << ": bias=" << with_bias << " residual=" << with_residual;
      }
    Vec want(size_t(rows) * in);
    ref::gemm(false, false, rows, in, out, 1.0, DY.data(), out, W.data(), in, 0.0, want.data(), want.data(), in);
    DevBuf<float> dx(be(), Vec(want.size(), 7.0f));
    be().dense_backward_input(rows, out, in, dy.get(), w.get(), dx.get());
    EXPECT_TRUE(close(dx.host(), want, 1e-5, 1e-5)) << when << ": dx";
  };
  for (bool pack : {false, true}) {
    if (!be().set_pack_weights(pack)) {  // (false always succeeds)
      std::cout << "[ INFO ] " << be().name() << " does not pack weights: its sgemm path only\n";
      continue;
    }
    const std::string how = pack ? "packed" : "not packed";
    be().copy(w.get(), W1.data(), W1.size() * sizeof(float));
    const long before = packed_dense_products_run();
    {
      const HeldWeights held(be());
      check(W1, how + ", held");
    }
    check(W1, how + ", outside a hold");
    be().copy(w.get(), W2.data(), W2.size() * sizeof(float));  // an update between two holds
    check(W2, how + ", changed, outside a hold");
    {
      const HeldWeights held(be());
      check(W2, how + ", held after the change");
    }
    // Two held checks of four forwards and one dx each: all by the packed copy, or none.
    EXPECT_EQ(packed_dense_products_run() - before, pack ? 10 : 0) << how;
    if (!pack) {
      EXPECT_EQ(be().refresh_packed_weights_until([] { return false; }), 0);
      continue;
    }
    // A wait's refresh ahead: after another update, the next hold refreshes the copies the
    // last one used (forward without and with a start, dx: three) until the input arrives,
    // and their products then read the new values.
    be().copy(w.get(), W1.data(), W1.size() * sizeof(float));
    EXPECT_EQ(be().refresh_packed_weights_until([] { return false; }), 0) << "outside a hold";
    {
      const HeldWeights held(be());
      int looks = 0;
      EXPECT_EQ(be().refresh_packed_weights_until([&] { return ++looks > 1; }), 1) << "arrived at the second look";
      EXPECT_EQ(be().refresh_packed_weights_until([] { return false; }), 2) << "the rest";
      EXPECT_EQ(be().refresh_packed_weights_until([] { return false; }), 0) << "all refreshed";
      check(W1, "packed, refreshed ahead after a change");
    }
    be().forget_packed_weights();  // the weights' owner goes: nothing left to refresh from
    {
      const HeldWeights held(be());
      EXPECT_EQ(be().refresh_packed_weights_until([] { return false; }), 0) << "after forgetting";
      check(W1, "packed, after forgetting");
    }
  }
  be().set_pack_weights(false);
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

// Grouped products (a mixture of experts' one per expert): each against the double
// reference, with an empty problem (M = 0) and one with no reduction (K = 0: C = beta C) among
// them, every transpose and both betas; `between` runs after each product where the backend
// runs them in turn (the CPU), never more often.
TEST_P(KernelGemmTest, GemmGrouped) {
  struct Shape {
    int M, N, K;
  };
  const std::vector<Shape> shapes = {{37, 29, 53}, {0, 29, 53}, {5, 29, 53}, {11, 29, 0}, {64, 29, 53}};
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.0f, 1.0f}) {
        std::vector<Vec> As, Bs, Cs, want;
        std::vector<std::unique_ptr<DevBuf<float>>> bufs;
        std::vector<GemmProblem> problems;
        for (size_t i = 0; i < shapes.size(); ++i) {
          const auto [M, N, K] = shapes[i];
          const int lda = ta ? M + 1 : K + 2, ldb = tb ? K + 3 : N, ldc = N + 4;
          As.push_back(random_vec(size_t(ta ? K : M) * lda + 1, 40 + i));
          Bs.push_back(random_vec(size_t(tb ? N : K) * ldb + 1, 50 + i));
          Cs.push_back(random_vec(size_t(M) * ldc + 1, 60 + i));
          want.push_back(Cs.back());
          ref::gemm(ta, tb, M, N, K, 0.7, As[i].data(), lda, Bs[i].data(), ldb, beta, Cs[i].data(), want[i].data(),
                    ldc);
          for (const Vec* v : {&As[i], &Bs[i], &Cs[i]}) bufs.push_back(std::make_unique<DevBuf<float>>(be(), *v));
          const size_t at = bufs.size();
          problems.push_back({M, N, K, bufs[at - 3]->get(), lda, bufs[at - 2]->get(), ldb, bufs[at - 1]->get(), ldc});
        }
        int calls = 0;
        be().gemm_grouped(ta, tb, 0.7f, beta, problems, [&] { ++calls; });
        EXPECT_LE(calls, static_cast<int>(shapes.size()));
        for (size_t i = 0; i < shapes.size(); ++i)
          EXPECT_TRUE(close(bufs[3 * i + 2]->host(), want[i], 1e-5, 1e-5))
              << "problem " << i << " ta=" << ta << " tb=" << tb << " beta=" << beta;
      }
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
