// Kernel harness for the tensor-parallel kernels: the vocabulary-sharded
// embedding (embedding_lookup/scatter, position_add/backward) and the three
// phases of the vocabulary-parallel cross-entropy. Each kernel is checked
// against the naive double references in kernel_reference.hpp (awkward sizes,
// accumulate semantics, tokens outside the shard, repeated tokens), and the
// sharded pipelines against the fused kernels: shards combined by hand (the
// all-reduces of a tensor-parallel run) must reproduce embedding_forward /
// embedding_backward / crossentropy_forward.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "kernel_backends.hpp"
#include "kernel_reference.hpp"
#include "pipetrain/backend/backend.hpp"
#include "pipetrain/backend/cuda.hpp"
#include "pipetrain/core/dtype.hpp"
#include "pipetrain/core/error.hpp"

namespace pipetrain {
namespace {

using ref::DVec;
using ref::plus;
using ref::random_vec;
using ref::Vec;
using Tokens = std::vector<int32_t>;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

using testing::BackendFactory;
using testing::backend_factories;
using testing::close;
using testing::DevBuf;
using testing::factory_name;

Vec to_float(const DVec& d) { return Vec(d.begin(), d.end()); }

// Columns [c0, c0 + w) of a row-major matrix with N rows and row stride ld.
Vec columns(const Vec& m, int N, int ld, int c0, int w) {
  Vec out(size_t(N) * w);
  for (int n = 0; n < N; ++n)
    std::copy_n(m.begin() + size_t(n) * ld + c0, w, out.begin() + size_t(n) * w);
  return out;
}

class KernelTpTest : public testing::BackendTest {
 protected:
  // The three cross-entropy phases on one shard (outputs start as NaN).
  Vec local_max(const Vec& logits, int N, int Vl, int col_begin, int V) {
    DevBuf<float> l(be(), logits), m(be(), Vec(N, kNaN));
    be().crossentropy_local_max(m.get(), l.get(), N, Vl, col_begin, V);
    return m.host();
  }
  void local_sums(Vec& sumexp, Vec& tlogit, const Vec& logits, const Vec& rowmax, const Tokens& t,
                  int N, int Vl, int col_begin, int V) {
    DevBuf<float> l(be(), logits), m(be(), rowmax), s(be(), Vec(N, kNaN)), tl(be(), Vec(N, kNaN));
    DevBuf<int32_t> dt(be(), t);
    be().crossentropy_local_sums(s.get(), tl.get(), l.get(), m.get(), dt.get(), N, Vl, col_begin,
                                 V);
    sumexp = s.host();
    tlogit = tl.host();
  }
  // Returns the losses; logits is replaced by what the kernel leaves there.
  Vec finish(Vec& logits, const Vec& rowmax, const Vec& sumexp, const Vec& tlogit,
             const Tokens& t, int N, int Vl, int col_begin, int V, float grad_scale) {
    DevBuf<float> l(be(), logits), m(be(), rowmax), s(be(), sumexp), tl(be(), tlogit),
        loss(be(), Vec(N, kNaN));
    DevBuf<int32_t> dt(be(), t);
    be().crossentropy_finish(loss.get(), l.get(), m.get(), s.get(), tl.get(), dt.get(), N, Vl,
                             col_begin, V, grad_scale);
    logits = l.host();
    return loss.host();
  }
};

INSTANTIATE_TEST_SUITE_P(Backends, KernelTpTest, ::testing::ValuesIn(backend_factories()),
                         factory_name);

// Tokens with repeats and values outside every shard of a 24-row padded table.
Tokens awkward_tokens(int N) {
  Tokens tok(N);
  for (int n = 0; n < N; ++n) tok[n] = (n * 7 + 3) % 24;
  tok[1] = tok[4] = tok[9] = tok[15] = 8;  // repeated, first row of shard [8, 19)
  tok[2] = -1, tok[6] = 24, tok[11] = 1000;
  tok[12] = std::numeric_limits<int32_t>::min(), tok[13] = std::numeric_limits<int32_t>::max();
  tok[14] = 18, tok[16] = 0, tok[17] = 23;  // shard edges
  return tok;
}

std::vector<bf16> rounded(const Vec& v) {
  std::vector<bf16> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = to_bf16(v[i]);
  return h;
}

Vec widened(const std::vector<bf16>& h) {
  Vec v(h.size());
  for (size_t i = 0; i < h.size(); ++i) v[i] = to_float(h[i]);
  return v;
}

struct RowRange {
  int begin, end;
};
const RowRange kShards[] = {{0, 8}, {8, 19}, {19, 24}, {5, 5}};

TEST_P(KernelTpTest, EmbeddingLookup) {
  for (int C : {37, 600}) {
    const int N = 23;
    const Tokens tok = awkward_tokens(N);
    DevBuf<int32_t> dt(be(), tok);
    for (RowRange r : kShards) {
      SCOPED_TRACE(::testing::Message() << "C=" << C << " rows [" << r.begin << ", " << r.end
                                        << ")");
      const Vec wte = random_vec(size_t(r.end - r.begin) * C, 100 + r.begin);
      DVec want;
      ref::embedding_lookup(want, tok, wte, r.begin, r.end, N, C);
      DevBuf<float> w(be(), wte), out(be(), Vec(size_t(N) * C, kNaN));  // overwritten
      be().embedding_lookup(out.get(), dt.get(), w.get(), r.begin, r.end, N, C);
      EXPECT_TRUE(close(out.host(), want, 0, 0));
      // From the table's bf16 copy: each value widened exactly.
      const std::vector<bf16> half = rounded(wte);
      DVec want_half;
      ref::embedding_lookup(want_half, tok, widened(half), r.begin, r.end, N, C);
      DevBuf<bf16> wh(be(), half);
      DevBuf<float> out_half(be(), Vec(size_t(N) * C, kNaN));
      be().embedding_lookup(out_half.get(), dt.get(), wh.get(), r.begin, r.end, N, C);
      EXPECT_TRUE(close(out_half.host(), want_half, 0, 0));
    }
  }
}

TEST_P(KernelTpTest, EmbeddingScatter) {
  for (int C : {37, 600}) {  // 600 spans several column blocks under a parallel host space
    const int N = 23;
    const Tokens tok = awkward_tokens(N);
    const Vec dout = random_vec(size_t(N) * C, 110);
    DevBuf<int32_t> dt(be(), tok);
    DevBuf<float> dd(be(), dout);
    for (RowRange r : kShards) {
      SCOPED_TRACE(::testing::Message() << "C=" << C << " rows [" << r.begin << ", " << r.end
                                        << ")");
      const Vec g0 = random_vec(size_t(r.end - r.begin) * C, 111 + r.begin);
      DVec want(g0.begin(), g0.end());
      ref::embedding_scatter(want, dout, tok, r.begin, r.end, N, C);
      DevBuf<float> g(be(), g0);
      be().embedding_scatter(g.get(), dd.get(), dt.get(), r.begin, r.end, N, C);
      const Vec got = g.host();
      EXPECT_TRUE(close(got, want, 1e-6, 1e-6));
      for (int row = r.begin; row < r.end; ++row) {  // rows no token hits stay untouched
        if (std::find(tok.begin(), tok.end(), row) != tok.end()) continue;
        for (int c = 0; c < C; ++c) {
          const size_t i = size_t(row - r.begin) * C + c;
          ASSERT_EQ(got[i], g0[i]) << "row " << row << " col " << c;
        }
      }
    }
  }
}

TEST_P(KernelTpTest, PositionAddAndBackward) {
  struct Shape {
    int B, T, C;
  };
  for (Shape s : {Shape{3, 7, 37}, Shape{5, 1, 600}, Shape{1, 13, 19}, Shape{4, 33, 600}}) {
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C);
    const size_t n = size_t(s.B) * s.T * s.C;
    const Vec wpe = random_vec(size_t(s.T) * s.C, 120), out0 = random_vec(n, 121);
    DVec want(out0.begin(), out0.end());
    ref::position_add(want, wpe, s.B, s.T, s.C);
    DevBuf<float> dw(be(), wpe), out(be(), out0);
    be().position_add(out.get(), dw.get(), s.B, s.T, s.C);
    EXPECT_TRUE(close(out.host(), want, 1e-6, 1e-7));
    const std::vector<bf16> half = rounded(wpe);  // from the bf16 copy: widened exactly
    DVec want_half(out0.begin(), out0.end());
    ref::position_add(want_half, widened(half), s.B, s.T, s.C);
    DevBuf<bf16> dh(be(), half);
    DevBuf<float> out_half(be(), out0);
    be().position_add(out_half.get(), dh.get(), s.B, s.T, s.C);
    EXPECT_TRUE(close(out_half.host(), want_half, 1e-6, 1e-7));

    const Vec dout = random_vec(n, 122), g0 = random_vec(wpe.size(), 123);
    DVec gwant(g0.begin(), g0.end());
    ref::position_backward(gwant, dout, s.B, s.T, s.C);
    DevBuf<float> dd(be(), dout), g(be(), g0);
    be().position_backward(g.get(), dd.get(), s.B, s.T, s.C);
    EXPECT_TRUE(close(g.host(), gwant, 1e-6, 1e-6));
  }
}

// Two vocabulary shards summed (the all-reduce) plus the position embedding
// give embedding_forward; their scatters plus position_backward give
// embedding_backward.
TEST_P(KernelTpTest, ShardedEmbeddingMatchesFused) {
  const int B = 3, T = 9, C = 45, vocab = 30, Vp = 32, half = Vp / 2, N = B * T;
  Tokens tok(N);
  for (int n = 0; n < N; ++n) tok[n] = (n * 11 + 5) % vocab;
  tok[0] = tok[7] = tok[20] = 3, tok[1] = tok[2] = 16, tok[3] = 15, tok[4] = vocab - 1;
  const Vec wte = random_vec(size_t(Vp) * C, 130), wpe = random_vec(size_t(T) * C, 131);
  DevBuf<int32_t> dt(be(), tok);
  DevBuf<float> dwte(be(), wte), dwpe(be(), wpe), fused(be(), Vec(size_t(N) * C));
  be().embedding_forward(fused.get(), dt.get(), dwte.get(), dwpe.get(), B, T, C);

  DevBuf<float> w0(be(), columns(wte, 1, Vp * C, 0, half * C)),
      w1(be(), columns(wte, 1, Vp * C, half * C, half * C)), out0(be(), Vec(size_t(N) * C, kNaN)),
      out1(be(), Vec(size_t(N) * C, kNaN));
  be().embedding_lookup(out0.get(), dt.get(), w0.get(), 0, half, N, C);
  be().embedding_lookup(out1.get(), dt.get(), w1.get(), half, Vp, N, C);
  be().accumulate(out0.get(), out1.get(), size_t(N) * C);
  be().position_add(out0.get(), dwpe.get(), B, T, C);
  EXPECT_EQ(out0.host(), fused.host());  // copies, + 0, one add: exact on any backend

  const Vec dout = random_vec(size_t(N) * C, 132), gte0 = random_vec(wte.size(), 133),
            gpe0 = random_vec(wpe.size(), 134);
  DevBuf<float> dd(be(), dout), gte(be(), gte0), gpe(be(), gpe0);
  be().embedding_backward(gte.get(), gpe.get(), dd.get(), dt.get(), B, T, C);
  DevBuf<float> g0(be(), columns(gte0, 1, Vp * C, 0, half * C)),
      g1(be(), columns(gte0, 1, Vp * C, half * C, half * C)), p(be(), gpe0);
  be().embedding_scatter(g0.get(), dd.get(), dt.get(), 0, half, N, C);
  be().embedding_scatter(g1.get(), dd.get(), dt.get(), half, Vp, N, C);
  be().position_backward(p.get(), dd.get(), B, T, C);
  Vec sharded = g0.host();
  const Vec upper = g1.host();
  sharded.insert(sharded.end(), upper.begin(), upper.end());
  EXPECT_TRUE(close(sharded, gte.host(), 1e-6, 1e-6));
  EXPECT_TRUE(close(p.host(), gpe.host(), 1e-6, 1e-6));
}

struct ColShard {
  int col_begin, Vl;
};

// Each phase on single shards of V = 1000 against the double reference; the
// global max and sums another rank would contribute are simulated.
TEST_P(KernelTpTest, CrossEntropyPhases) {
  const int N = 13, V = 1000;
  for (ColShard sh : {ColShard{0, 333}, ColShard{700, 317}, ColShard{1000, 24},
                      ColShard{995, 5}, ColShard{40, 1}}) {
    SCOPED_TRACE(::testing::Message() << "col_begin=" << sh.col_begin << " Vl=" << sh.Vl);
    const int Vl = sh.Vl, nreal = std::clamp(V - sh.col_begin, 0, Vl);
    Vec logits = random_vec(size_t(N) * Vl, 140 + sh.col_begin, -4.0f, 4.0f);
    for (int n = 0; n < N; ++n)
      for (int v = nreal; v < Vl; ++v) logits[size_t(n) * Vl + v] = 100.0f;  // padding: ignored
    Tokens t(N);
    for (int n = 0; n < N; ++n) t[n] = (n * 389 + 7) % V;
    t[0] = std::min(sh.col_begin, V - 1), t[1] = std::min(sh.col_begin + Vl, V) - 1;
    t[2] = V - 1, t[3] = 0;

    DVec max_ref;
    ref::crossentropy_local_max(max_ref, logits, N, Vl, sh.col_begin, V);
    const Vec rowmax = local_max(logits, N, Vl, sh.col_begin, V);
    EXPECT_EQ(rowmax, to_float(max_ref));  // -inf for a shard without real columns

    // A global max >= the local one (another rank may hold a larger logit).
    const Vec bump = random_vec(N, 141, 0.0f, 2.0f);
    Vec gmax(N);
    for (int n = 0; n < N; ++n) gmax[n] = (nreal > 0 ? rowmax[n] : 1.0f) + (n % 2) * bump[n];
    DVec sum_ref, tl_ref;
    ref::crossentropy_local_sums(sum_ref, tl_ref, logits, gmax, t, N, Vl, sh.col_begin, V);
    Vec sumexp, tlogit;
    local_sums(sumexp, tlogit, logits, gmax, t, N, Vl, sh.col_begin, V);
    EXPECT_TRUE(close(sumexp, sum_ref, 1e-6, 0));  // exactly 0 without real columns
    EXPECT_TRUE(close(tlogit, tl_ref, 0, 0));

    // Global sums: this shard's plus what the other ranks would add.
    const Vec extra = random_vec(N, 142, 0.5f, 20.0f), other_tl = random_vec(N, 143, -4.f, 4.f);
    Vec gsum(N), gtl(N);
    for (int n = 0; n < N; ++n) {
      gsum[n] = sumexp[n] + extra[n];
      const bool here = t[n] >= sh.col_begin && t[n] < sh.col_begin + nreal;
      gtl[n] = here ? tlogit[n] : other_tl[n];
    }
    for (float gs : {0.25f, 0.0f}) {
      DVec loss_ref, grad_ref;
      ref::crossentropy_finish(loss_ref, grad_ref, logits, gmax, gsum, gtl, t, N, Vl,
                               sh.col_begin, V, gs);
      Vec work(logits);
      EXPECT_TRUE(close(finish(work, gmax, gsum, gtl, t, N, Vl, sh.col_begin, V, gs), loss_ref,
                        1e-5, 1e-6));
      if (gs == 0.0f) {
        EXPECT_EQ(work, logits);  // no gradient: logits untouched
        continue;
      }
      EXPECT_TRUE(close(work, grad_ref, 1e-5, 1e-8));
      for (int n = 0; n < N; ++n)
        for (int v = nreal; v < Vl; ++v) ASSERT_EQ(work[size_t(n) * Vl + v], 0.0f);
    }
  }
}

TEST_P(KernelTpTest, CrossEntropyPhasesRejectBadTargets) {
  const int N = 9, V = 50, Vl = 32;
  const Vec logits = random_vec(size_t(N) * Vl, 150);
  Tokens t(N, 3);
  for (int col_begin : {0, 64}) {  // also on a shard that lies entirely in the padding
    for (int bad : {V, -2, std::numeric_limits<int32_t>::max()}) {
      SCOPED_TRACE(::testing::Message() << "col_begin=" << col_begin << " target=" << bad);
      Tokens tb(t);
      tb[5] = bad;
      DevBuf<int32_t> dt(be(), tb);
      DevBuf<float> l(be(), logits), m(be(), Vec(N, 1.0f)), s(be(), Vec(N, 7.0f)),
          tl(be(), Vec(N, 7.0f)), loss(be(), Vec(N, 7.0f));
      auto expect_error = [&](const std::function<void()>& call) {
        try {
          call();
          ADD_FAILURE() << "target " << bad << " did not throw";
        } catch (const Error& e) {
          const std::string msg = e.what();
          EXPECT_NE(msg.find("row 5"), std::string::npos) << msg;
          EXPECT_NE(msg.find(std::to_string(bad)), std::string::npos) << msg;
        }
      };
      expect_error([&] {
        be().crossentropy_local_sums(s.get(), tl.get(), l.get(), m.get(), dt.get(), N, Vl,
                                     col_begin, V);
      });
      expect_error([&] {
        be().crossentropy_finish(loss.get(), l.get(), m.get(), s.get(), tl.get(), dt.get(), N,
                                 Vl, col_begin, V, 1.0f);
      });
      EXPECT_EQ(s.host(), Vec(N, 7.0f));  // nothing written before the check
      EXPECT_EQ(tl.host(), Vec(N, 7.0f));
      EXPECT_EQ(loss.host(), Vec(N, 7.0f));
      EXPECT_EQ(l.host(), logits);
    }
  }
}

// Logits of a padded vocabulary split into column shards; phases 1-3 with the
// max and sum all-reduces done by hand reproduce crossentropy_forward on the
// unsplit logits: the same losses on every shard and, concatenated, the same
// gradient. V = 700 with 4 shards and V = 1000 with 64 shards include shards
// that lie entirely in the padding.
TEST_P(KernelTpTest, ShardedCrossEntropyMatchesFused) {
  struct Split {
    int V, Vp, shards;
  };
  const int N = 13;
  const float gs = 0.25f;
  for (Split sp : {Split{1000, 1024, 1}, Split{1000, 1024, 2}, Split{1000, 1024, 4},
                   Split{1000, 1024, 64}, Split{700, 1024, 4}}) {
    SCOPED_TRACE(::testing::Message() << "V=" << sp.V << " Vp=" << sp.Vp << " shards="
                                      << sp.shards);
    const int V = sp.V, Vp = sp.Vp, S = sp.shards, Vl = Vp / S;
    Vec logits = random_vec(size_t(N) * Vp, 160, -4.0f, 4.0f);
    for (int v = 0; v < Vp; ++v) logits[size_t(3) * Vp + v] *= 10.0f;  // a wide row
    for (int n = 0; n < N; ++n)
      for (int v = V; v < Vp; ++v) logits[size_t(n) * Vp + v] = 100.0f;  // must be ignored
    Tokens t(N);
    for (int n = 0; n < N; ++n) t[n] = (n * 389 + 7) % V;
    t[0] = 0, t[1] = V - 1, t[2] = 255, t[4] = 256, t[5] = 511, t[6] = 512;

    DevBuf<int32_t> dt(be(), t);
    DevBuf<float> fl(be(), logits), floss(be(), Vec(N));
    be().crossentropy_forward(floss.get(), fl.get(), dt.get(), N, V, Vp, gs);
    const Vec want_loss = floss.host(), want_grad = fl.host();

    std::vector<Vec> shard(S);
    Vec gmax(N, -kInf);  // all-reduce(max)
    for (int s = 0; s < S; ++s) {
      shard[s] = columns(logits, N, Vp, s * Vl, Vl);
      const Vec m = local_max(shard[s], N, Vl, s * Vl, V);
      for (int n = 0; n < N; ++n) gmax[n] = std::max(gmax[n], m[n]);
    }
    Vec gsum(N, 0.0f), gtl(N, 0.0f);  // all-reduce(sum)
    for (int s = 0; s < S; ++s) {
      Vec sumexp, tlogit;
      local_sums(sumexp, tlogit, shard[s], gmax, t, N, Vl, s * Vl, V);
      for (int n = 0; n < N; ++n) gsum[n] += sumexp[n], gtl[n] += tlogit[n];
    }
    Vec grad(size_t(N) * Vp);
    for (int s = 0; s < S; ++s) {
      const Vec loss = finish(shard[s], gmax, gsum, gtl, t, N, Vl, s * Vl, V, gs);
      EXPECT_TRUE(close(loss, want_loss, 1e-5, 0)) << "shard " << s;
      for (int n = 0; n < N; ++n)
        std::copy_n(shard[s].begin() + size_t(n) * Vl, Vl, grad.begin() + size_t(n) * Vp + s * Vl);
    }
    EXPECT_TRUE(close(grad, want_grad, 1e-5, 1e-9));
    for (int n = 0; n < N; ++n)
      for (int v = V; v < Vp; ++v) ASSERT_EQ(grad[size_t(n) * Vp + v], 0.0f);
    if (S == 1 && be().device().kind == DeviceKind::Host) {
      EXPECT_EQ(grad, want_grad);  // the CPU kernels share the fused row arithmetic
    }
  }
}

}  // namespace
}  // namespace pipetrain
