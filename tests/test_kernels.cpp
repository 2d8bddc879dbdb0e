// The kernel harness: every backend in backend_factories() is checked, kernel by
// kernel, against the naive double-precision references in kernel_reference.hpp
// on random inputs with awkward sizes, and its backward kernels against central
// finite differences of its own forward kernels. Inputs travel to device memory
// through Backend::allocate/copy (host memory for the CPU backend; a CUDA
// backend's copy must accept host pointers, e.g. cudaMemcpyDefault, or
// upload/download below must change).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "kernel_backends.hpp"
#include "fd_check.hpp"
#include "kernel_reference.hpp"
#include "pipetrain/backend/backend.hpp"
#include "pipetrain/backend/cuda.hpp"
#include "pipetrain/core/error.hpp"

namespace pipetrain {
namespace {

using ref::dot;
using ref::DVec;
using ref::max_abs;
using ref::plus;
using ref::random_vec;
using ref::Vec;
using Tokens = std::vector<int32_t>;

using testing::BackendFactory;
using testing::backend_factories;
using testing::close;
using testing::DevBuf;
using testing::factory_name;
using testing::fd_check;

class KernelTest : public testing::BackendTest {
 protected:
  Vec layernorm_out(const Vec& x, const Vec& w, const Vec& b, int N, int C, Vec* mean = nullptr,
                    Vec* rstd = nullptr) {
    DevBuf<float> dx(be(), x), dw(be(), w), db(be(), b), out(be(), Vec(x.size())),
        m(be(), Vec(N)), r(be(), Vec(N));
    be().layernorm_forward(out.get(), m.get(), r.get(), dx.get(), dw.get(), db.get(), N, C, 1e-5f);
    if (mean) *mean = m.host();
    if (rstd) *rstd = r.host();
    return out.host();
  }
  Vec gelu_out(const Vec& x) {
    DevBuf<float> dx(be(), x), out(be(), Vec(x.size()));
    be().gelu_forward(out.get(), dx.get(), x.size());
    return out.host();
  }
};

INSTANTIATE_TEST_SUITE_P(Backends, KernelTest, ::testing::ValuesIn(backend_factories()),
                         factory_name);

TEST_P(KernelTest, NameAndMemory) {
  EXPECT_FALSE(be().name().empty());
  for (size_t bytes : {size_t(0), size_t(1), size_t(63), size_t(65), size_t(1000)}) {
    void* p = be().allocate(bytes);
    EXPECT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << bytes << " bytes";
    be().deallocate(p, bytes);
  }
  const size_t huge = size_t(1) << 62;
  try {
    be().allocate(huge);
    ADD_FAILURE() << "allocating 2^62 bytes did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(huge)), std::string::npos) << e.what();
  }
}



TEST_P(KernelTest, LayerNorm) {
  const int N = 37, C = 77;
  const Vec x = random_vec(size_t(N) * C, 9, 2.0f, 4.0f);  // mean ~3: tests the variance pass
  const Vec w = random_vec(C, 10), b = random_vec(C, 11);
  DVec out_ref, mean_ref, rstd_ref;
  ref::layernorm_forward(out_ref, mean_ref, rstd_ref, x, w, b, N, C, 1e-5);
  Vec mean, rstd;
  const Vec out = layernorm_out(x, w, b, N, C, &mean, &rstd);
  EXPECT_TRUE(close(out, out_ref, 1e-5, 1e-5));
  EXPECT_TRUE(close(mean, mean_ref, 1e-6, 0));
  EXPECT_TRUE(close(rstd, rstd_ref, 1e-5, 0));

  const Vec dout = random_vec(out.size(), 12);
  const Vec dinp0 = random_vec(out.size(), 13), dw0 = random_vec(C, 14), db0 = random_vec(C, 15);
  DVec dinp_ref, dw_ref, db_ref;
  ref::layernorm_backward(dinp_ref, dw_ref, db_ref, dout, x, w, N, C, 1e-5);
  DevBuf<float> ddout(be(), dout), dx(be(), x), dw(be(), w), dm(be(), mean), dr(be(), rstd),
      dinp(be(), dinp0), gw(be(), dw0), gb(be(), db0);
  be().layernorm_backward_input(dinp.get(), ddout.get(), dx.get(), dw.get(), dm.get(), dr.get(), N,
                                C);
  be().layernorm_backward_weight(gw.get(), gb.get(), ddout.get(), dx.get(), dm.get(), dr.get(), N,
                                 C);
  EXPECT_TRUE(close(dinp.host(), plus(dinp0, dinp_ref), 1e-5, 1e-5 * max_abs(dinp_ref)));
  EXPECT_TRUE(close(gw.host(), plus(dw0, dw_ref), 1e-5, 1e-5));
  EXPECT_TRUE(close(gb.host(), plus(db0, db_ref), 1e-5, 1e-5));
}

TEST_P(KernelTest, Gelu) {
  Vec x = random_vec(1003, 16, -6.0f, 6.0f);
  x[0] = -20.0f, x[1] = 20.0f, x[2] = 0.0f, x[3] = -1e-4f;
  DVec want(x.size()), dwant(x.size());
  const Vec dout = random_vec(x.size(), 17);
  for (size_t i = 0; i < x.size(); ++i) {
    want[i] = ref::gelu(x[i]);
    dwant[i] = ref::gelu_grad(x[i]) * dout[i];
  }
  EXPECT_TRUE(close(gelu_out(x), want, 1e-5, 1e-7));
  DevBuf<float> dx(be(), x), dd(be(), dout), dinp(be(), Vec(x.size(), 3.0f));
  be().gelu_backward(dinp.get(), dx.get(), dd.get(), x.size());
  EXPECT_TRUE(close(dinp.host(), dwant, 1e-5, 1e-6));
  be().gelu_backward(dd.get(), dx.get(), dd.get(), x.size());  // dinp aliases dout
  EXPECT_TRUE(close(dd.host(), dwant, 1e-5, 1e-6));
}

TEST_P(KernelTest, CrossEntropy) {
  const int N = 13, V = 1003, Vp = 1024;
  Vec logits = random_vec(size_t(N) * Vp, 18, -4.0f, 4.0f);
  for (int n = 0; n < N; ++n)
    for (int v = V; v < Vp; ++v) logits[size_t(n) * Vp + v] = 100.0f;  // must be ignored
  Tokens t(N);
  for (int n = 0; n < N; ++n) t[n] = (n * 389 + 7) % V;
  t[0] = 0, t[1] = V - 1;
  DVec loss_ref, grad_ref;
  ref::crossentropy(loss_ref, grad_ref, logits, t, N, V, Vp);

  DevBuf<int32_t> dt(be(), t);
  {  // no gradient: logits untouched
    DevBuf<float> dl(be(), logits), loss(be(), Vec(N));
    be().crossentropy_forward(loss.get(), dl.get(), dt.get(), N, V, Vp, 0.0f);
    EXPECT_TRUE(close(loss.host(), loss_ref, 1e-5, 1e-6));
    EXPECT_EQ(dl.host(), logits);
  }
  {  // fused gradient, scaled; padded columns zero
    DevBuf<float> dl(be(), logits), loss(be(), Vec(N));
    be().crossentropy_forward(loss.get(), dl.get(), dt.get(), N, V, Vp, 0.25f);
    EXPECT_TRUE(close(loss.host(), loss_ref, 1e-5, 1e-6));
    DVec g(grad_ref);
    for (auto& x : g) x *= 0.25;
    const Vec got = dl.host();
    EXPECT_TRUE(close(got, g, 1e-5, 1e-8));
    for (int n = 0; n < N; ++n)
      for (int v = V; v < Vp; ++v) ASSERT_EQ(got[size_t(n) * Vp + v], 0.0f);
  }
  for (int bad : {V, -2}) {  // out-of-range target (-1 is kIgnoredTarget): an Error naming row and value
    Tokens tb(t);
    tb[5] = bad;
    DevBuf<int32_t> dtb(be(), tb);
    DevBuf<float> dl(be(), logits), loss(be(), Vec(N));
    try {
      be().crossentropy_forward(loss.get(), dl.get(), dtb.get(), N, V, Vp, 1.0f);
      ADD_FAILURE() << "target " << bad << " did not throw";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("row 5"), std::string::npos) << msg;
      EXPECT_NE(msg.find(std::to_string(bad)), std::string::npos) << msg;
    }
  }
}

TEST_P(KernelTest, Embedding) {
  const int B = 3, T = 7, C = 37, vocab = 11;
  Tokens tok(B * T);
  for (int i = 0; i < B * T; ++i) tok[i] = (i * 5) % vocab;
  tok[3] = tok[4] = tok[10] = 2;  // repeated tokens
  const Vec wte = random_vec(size_t(vocab) * C, 19), wpe = random_vec(size_t(T) * C, 20);
  DVec out_ref;
  ref::embedding_forward(out_ref, tok, wte, wpe, B, T, C);
  DevBuf<int32_t> dt(be(), tok);
  DevBuf<float> dwte(be(), wte), dwpe(be(), wpe), out(be(), Vec(size_t(B) * T * C));
  be().embedding_forward(out.get(), dt.get(), dwte.get(), dwpe.get(), B, T, C);
  EXPECT_TRUE(close(out.host(), out_ref, 1e-6, 0));

  const Vec dout = random_vec(out_ref.size(), 21);
  const Vec gte0 = random_vec(wte.size(), 22), gpe0 = random_vec(wpe.size(), 23);
  DVec gte_ref(gte0.begin(), gte0.end()), gpe_ref(gpe0.begin(), gpe0.end());
  ref::embedding_backward(gte_ref, gpe_ref, dout, tok, B, T, C);
  DevBuf<float> dd(be(), dout), gte(be(), gte0), gpe(be(), gpe0);
  be().embedding_backward(gte.get(), gpe.get(), dd.get(), dt.get(), B, T, C);
  EXPECT_TRUE(close(gte.host(), gte_ref, 1e-6, 1e-6));
  EXPECT_TRUE(close(gpe.host(), gpe_ref, 1e-6, 1e-6));
}

TEST_P(KernelTest, AdamW) {
  const size_t n = 1003;
  const Vec p0 = random_vec(n, 24), g1 = random_vec(n, 25), g2 = random_vec(n, 26);
  const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, gs = 0.5;
  DVec p(p0.begin(), p0.end()), m(n, 0.0), v(n, 0.0);
  DevBuf<float> dp(be(), p0), dm(be(), Vec(n, 0.0f)), dv(be(), Vec(n, 0.0f)), dg1(be(), g1),
      dg2(be(), g2);
  int step = 1;
  for (DevBuf<float>* g : {&dg1, &dg2}) {
    ref::adamw(p, step == 1 ? g1 : g2, m, v, lr, b1, b2, eps, wd, step, gs);
    be().adamw(dp.get(), g->get(), dm.get(), dv.get(), n, lr, b1, b2, eps, wd, step, gs);
    EXPECT_TRUE(close(dp.host(), p, 1e-6, 1e-7)) << "step " << step;
    EXPECT_TRUE(close(dm.host(), m, 1e-6, 1e-8)) << "step " << step;
    EXPECT_TRUE(close(dv.host(), v, 1e-5, 1e-10)) << "step " << step;
    if (step == 1) {
      // Bias correction: the first step moves every parameter by ~lr*(sign(g) + wd*p).
      const Vec p1 = dp.host();
      for (size_t i = 0; i < n; ++i) {
        // g / (|g| + eps) differs from sign(g) by ~eps / |g|.
        const double want = p0[i] - lr * ((g1[i] > 0 ? 1.0 : -1.0) + wd * p0[i]);
        ASSERT_NEAR(p1[i], want, 1e-6 + lr * 2 * eps / std::abs(gs * g1[i])) << i;
      }
    }
    ++step;
  }
}

// Buffers past 4 MB are filled with streaming stores on x86-64 (their own aligned body,
// scalar head and tail): every element of an unaligned range set, its neighbours not.
TEST_P(KernelTest, FillLargeUnalignedRange) {
  const size_t n = (size_t(4) << 20) / sizeof(float) + 8195;  // past the streaming threshold, odd chunks
  DevBuf<float> buf(be(), Vec(n + 8, -1.0f));
  for (size_t offset : {size_t(0), size_t(1), size_t(3)}) {
    be().fill(buf.get() + offset, 0.0f, n);
    const Vec h = buf.host();
    for (size_t i = 0; i < offset; ++i) ASSERT_EQ(h[i], -1.0f) << "offset " << offset << ", element " << i;
    for (size_t i = offset; i < offset + n; ++i) ASSERT_EQ(h[i], 0.0f) << "offset " << offset << ", element " << i;
    for (size_t i = offset + n; i < n + 8; ++i) ASSERT_EQ(h[i], -1.0f) << "offset " << offset << ", element " << i;
    be().fill(buf.get(), -1.0f, n + 8);
  }
}

TEST_P(KernelTest, ElementwiseAndReductions) {
  const size_t n = 10007;  // more than one chunk, not a multiple of 8
  const Vec a = random_vec(n, 27), b = random_vec(n, 28);
  DevBuf<float> da(be(), a), db(be(), b), out(be(), Vec(n, 9.0f));
  DVec want(n);
  be().add(out.get(), da.get(), db.get(), n);
  for (size_t i = 0; i < n; ++i) want[i] = double(a[i] + b[i]);
  EXPECT_TRUE(close(out.host(), want, 0, 0));
  be().accumulate(out.get(), da.get(), n);
  for (size_t i = 0; i < n; ++i) want[i] = double((a[i] + b[i]) + a[i]);
  EXPECT_TRUE(close(out.host(), want, 0, 0));
  be().scale(out.get(), -0.5f, n);
  for (size_t i = 0; i < n; ++i) want[i] = double(((a[i] + b[i]) + a[i]) * -0.5f);
  EXPECT_TRUE(close(out.host(), want, 0, 0));
  be().copy(out.get(), db.get(), n * sizeof(float));
  EXPECT_EQ(out.host(), b);
  be().fill(out.get(), 2.5f, n);
  EXPECT_EQ(out.host(), Vec(n, 2.5f));

  double ss = 0.0;
  for (float x : a) ss += double(x) * x;
  EXPECT_NEAR(be().sum_squares(da.get(), n), ss, 1e-12 * ss);
  EXPECT_EQ(be().sum_squares(da.get(), 0), 0.0);

  EXPECT_TRUE(be().all_finite(da.get(), n));
  for (float badv : {std::numeric_limits<float>::quiet_NaN(), INFINITY, -INFINITY}) {
    Vec c(a);
    c[n - 3] = badv;
    DevBuf<float> dc(be(), c);
    EXPECT_FALSE(be().all_finite(dc.get(), n)) << badv;
  }

  const int N = 13, C = 600;  // C spans more than one column block
  const Vec m = random_vec(size_t(N) * C, 29), bias = random_vec(C, 30), db0 = random_vec(C, 31);
  DVec badd(m.size()), bgrad(db0.begin(), db0.end());
  for (int r = 0; r < N; ++r)
    for (int c = 0; c < C; ++c) {
      badd[size_t(r) * C + c] = double(m[size_t(r) * C + c] + bias[c]);
      bgrad[c] += m[size_t(r) * C + c];
    }
  DevBuf<float> dmat(be(), m), dbias(be(), bias), dgrad(be(), db0);
  be().bias_backward(dgrad.get(), dmat.get(), N, C);
  EXPECT_TRUE(close(dgrad.host(), bgrad, 1e-6, 1e-6));
  be().bias_add(dmat.get(), dbias.get(), N, C);
  EXPECT_TRUE(close(dmat.host(), badd, 0, 0));
}

// ---- backward kernels against central finite differences of the forward ----


TEST_P(KernelTest, GradCheckLayerNorm) {
  const int N = 3, C = 37;
  const Vec x = random_vec(size_t(N) * C, 34), w = random_vec(C, 35), b = random_vec(C, 36);
  const Vec R = random_vec(x.size(), 37);
  Vec mean, rstd;
  layernorm_out(x, w, b, N, C, &mean, &rstd);
  DevBuf<float> dR(be(), R), dx(be(), x), dw(be(), w), dm(be(), mean), dr(be(), rstd),
      gx(be(), Vec(x.size(), 0.0f)), gw(be(), Vec(C, 0.0f)), gb(be(), Vec(C, 0.0f));
  be().layernorm_backward_input(gx.get(), dR.get(), dx.get(), dw.get(), dm.get(), dr.get(), N, C);
  be().layernorm_backward_weight(gw.get(), gb.get(), dR.get(), dx.get(), dm.get(), dr.get(), N, C);
  EXPECT_TRUE(fd_check(x, gx.host(), [&](const Vec& v) {
    return dot(layernorm_out(v, w, b, N, C), R);
  }));
  EXPECT_TRUE(fd_check(w, gw.host(), [&](const Vec& v) {
    return dot(layernorm_out(x, v, b, N, C), R);
  }));
  EXPECT_TRUE(fd_check(b, gb.host(), [&](const Vec& v) {
    return dot(layernorm_out(x, w, v, N, C), R);
  }));
}

TEST_P(KernelTest, GradCheckGelu) {
  const Vec x = random_vec(101, 38, -5.0f, 5.0f), R = random_vec(101, 39);
  DevBuf<float> dx(be(), x), dR(be(), R), g(be(), Vec(x.size()));
  be().gelu_backward(g.get(), dx.get(), dR.get(), x.size());
  EXPECT_TRUE(fd_check(x, g.host(), [&](const Vec& v) { return dot(gelu_out(v), R); }));
}

TEST_P(KernelTest, GradCheckCrossEntropy) {
  const int N = 4, V = 37, Vp = 40;
  const Vec logits = random_vec(size_t(N) * Vp, 40, -3.0f, 3.0f);
  const Tokens t = {0, 36, 5, 5};
  DevBuf<int32_t> dt(be(), t);
  auto run = [&](const Vec& l, float grad_scale, Vec* grad) {
    DevBuf<float> dl(be(), l), loss(be(), Vec(N));
    be().crossentropy_forward(loss.get(), dl.get(), dt.get(), N, V, Vp, grad_scale);
    if (grad) *grad = dl.host();
    double s = 0.0;
    for (float x : loss.host()) s += x;
    return s;
  };
  Vec grad;
  run(logits, 1.0f, &grad);
  EXPECT_TRUE(fd_check(logits, grad, [&](const Vec& l) { return run(l, 0.0f, nullptr); }));
}

}  // namespace
}  // namespace pipetrain

// ---- Llama kernels: RMSNorm, RoPE, SwiGLU (grouped-query attention: test_kernels_attention.cpp) ----
namespace pipetrain {
namespace {





TEST_P(KernelTest, RmsNorm) {
  const int N = 37, C = 77;
  const Vec x = random_vec(size_t(N) * C, 64, -2.0f, 3.0f), w = random_vec(C, 65);
  auto forward = [&](const Vec& xv, const Vec& wv, Vec* rstd) {
    DevBuf<float> dx(be(), xv), dw(be(), wv), out(be(), Vec(xv.size())), r(be(), Vec(N));
    be().rmsnorm_forward(out.get(), r.get(), dx.get(), dw.get(), N, C, 1e-5f);
    if (rstd) *rstd = r.host();
    return out.host();
  };
  DVec out_ref, rstd_ref, dx_ref, dw_ref;
  ref::rmsnorm_forward(out_ref, rstd_ref, x, w, N, C, 1e-5);
  Vec rstd;
  EXPECT_TRUE(close(forward(x, w, &rstd), out_ref, 1e-5, 1e-6));
  EXPECT_TRUE(close(rstd, rstd_ref, 1e-5, 0));
  const Vec dout = random_vec(x.size(), 66), dx0 = random_vec(x.size(), 67), dw0 = random_vec(C, 68);
  ref::rmsnorm_backward(dx_ref, dw_ref, dout, x, w, N, C, 1e-5);
  for (size_t i = 0; i < dx_ref.size(); ++i) dx_ref[i] += dx0[i];  // both accumulate
  for (size_t i = 0; i < dw_ref.size(); ++i) dw_ref[i] += dw0[i];
  DevBuf<float> dd(be(), dout), dx(be(), x), dw(be(), w), dr(be(), rstd), gx(be(), dx0), gw(be(), dw0);
  be().rmsnorm_backward_input(gx.get(), dd.get(), dx.get(), dw.get(), dr.get(), N, C);
  be().rmsnorm_backward_weight(gw.get(), dd.get(), dx.get(), dr.get(), N, C);
  EXPECT_TRUE(close(gx.host(), dx_ref, 1e-4, 1e-5));
  EXPECT_TRUE(close(gw.host(), dw_ref, 1e-4, 1e-4));
  // Finite differences on a small case.
  const int n = 3, c = 19;
  const Vec xs = random_vec(size_t(n) * c, 69), ws = random_vec(c, 70), Rs = random_vec(xs.size(), 71);
  auto small = [&](const Vec& xv, const Vec& wv, Vec* rs) {
    DevBuf<float> dxv(be(), xv), dwv(be(), wv), out(be(), Vec(xv.size())), r(be(), Vec(n));
    be().rmsnorm_forward(out.get(), r.get(), dxv.get(), dwv.get(), n, c, 1e-5f);
    if (rs) *rs = r.host();
    return out.host();
  };
  Vec rs;
  small(xs, ws, &rs);
  DevBuf<float> dR(be(), Rs), dxs(be(), xs), dws(be(), ws), drs(be(), rs), ax(be(), Vec(xs.size(), 0.0f)),
      aw(be(), Vec(c, 0.0f));
  be().rmsnorm_backward_input(ax.get(), dR.get(), dxs.get(), dws.get(), drs.get(), n, c);
  be().rmsnorm_backward_weight(aw.get(), dR.get(), dxs.get(), drs.get(), n, c);
  EXPECT_TRUE(fd_check(xs, ax.host(), [&](const Vec& v) { return dot(small(v, ws, nullptr), Rs); }));
  EXPECT_TRUE(fd_check(ws, aw.host(), [&](const Vec& v) { return dot(small(xs, v, nullptr), Rs); }));
}

TEST_P(KernelTest, Rope) {
  // The Q part of a (B, T, C + 2 Ckv) row: 4 heads of 8; the K part: 2 heads at offset C.
  const int B = 2, T = 13, hs = 8, NH = 4, NKV = 2, C = NH * hs, ld = C + 2 * NKV * hs;
  const Vec x = random_vec(size_t(B) * T * ld, 72, -2.0f, 2.0f);
  const double theta = 10000.0;
  auto apply = [&](const Vec& v, bool inverse) {
    DevBuf<float> d(be(), v);
    be().rope(d.get(), B, T, ld, NH, hs, static_cast<float>(theta), inverse);  // Q
    be().rope(d.get() + C, B, T, ld, NKV, hs, static_cast<float>(theta), inverse);  // K
    return d.host();
  };
  DVec want = ref::rope(x, B, T, ld, NH, hs, theta, false);
  {
    Vec shifted(x.size());  // the K part, via the reference on a view shifted by C
    const DVec k = ref::rope(Vec(x.begin() + C, x.end()), B, T, ld, NKV, hs, theta, false);
    for (size_t i = 0; i + C < x.size(); ++i)
      if ((i % ld) < static_cast<size_t>(NKV * hs)) want[i + C] = k[i];
  }
  const Vec y = apply(x, false);
  EXPECT_TRUE(close(y, want, 1e-5, 1e-5));  // V and the channels past it are untouched (want = x there)
  EXPECT_TRUE(close(apply(y, true), DVec(x.begin(), x.end()), 1e-5, 1e-5)) << "inverse undoes the rotation";
  // The backward is the transpose: <rope(a), b> = <a, rope^-1(b)>.
  const Vec b = random_vec(x.size(), 73);
  EXPECT_NEAR(dot(apply(x, false), b), dot(x, apply(b, true)), 1e-4 * std::abs(dot(x, b)) + 1e-3);
  try {
    DevBuf<float> d(be(), Vec(6));
    be().rope(d.get(), 1, 2, 3, 1, 3, 10000.0f, false);
    ADD_FAILURE() << "an odd head size was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("odd"), std::string::npos) << e.what();
  }
}

TEST_P(KernelTest, SwiGlu) {
  const size_t n = 1001;
  const Vec g = random_vec(n, 74, -6.0f, 6.0f), u = random_vec(n, 75), d = random_vec(n, 76);
  auto forward = [&](const Vec& gv, const Vec& uv) {
    DevBuf<float> dg(be(), gv), du(be(), uv), out(be(), Vec(n));
    be().swiglu_forward(out.get(), dg.get(), du.get(), n);
    return out.host();
  };
  DVec want(n), dg_ref(n), du_ref(n);
  for (size_t i = 0; i < n; ++i) {
    want[i] = ref::silu(g[i]) * u[i];
    dg_ref[i] = d[i] * u[i] * ref::silu_grad(g[i]);
    du_ref[i] = d[i] * ref::silu(g[i]);
  }
  EXPECT_TRUE(close(forward(g, u), want, 1e-5, 1e-6));
  DevBuf<float> dg(be(), g), du(be(), u), dd(be(), d), gg(be(), Vec(n)), gu(be(), d);
  be().swiglu_backward(gg.get(), gu.get(), gu.get(), dg.get(), du.get(), n);  // du aliases dout
  EXPECT_TRUE(close(gg.host(), dg_ref, 1e-5, 1e-6));
  EXPECT_TRUE(close(gu.host(), du_ref, 1e-5, 1e-6));
  const Vec gs(g.begin(), g.begin() + 40), us(u.begin(), u.begin() + 40), ds(d.begin(), d.begin() + 40);
  auto small = [&](const Vec& gv, const Vec& uv) {
    DevBuf<float> a(be(), gv), b(be(), uv), out(be(), Vec(40));
    be().swiglu_forward(out.get(), a.get(), b.get(), 40);
    return out.host();
  };
  DevBuf<float> a(be(), gs), b(be(), us), dds(be(), ds), ag(be(), Vec(40)), au(be(), Vec(40));
  be().swiglu_backward(ag.get(), au.get(), dds.get(), a.get(), b.get(), 40);
  EXPECT_TRUE(fd_check(gs, ag.host(), [&](const Vec& v) { return dot(small(v, us), ds); }));
  EXPECT_TRUE(fd_check(us, au.host(), [&](const Vec& v) { return dot(small(gs, v), ds); }));
}

}  // namespace
}  // namespace pipetrain
