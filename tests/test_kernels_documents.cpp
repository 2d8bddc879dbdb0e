// The kernels on packed documents (core/documents.hpp), on every backend: attention,
// rotary angles and position embeddings given each token's place in its document behave
// as if each document ran alone; an ignored target takes part nowhere in the loss.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernel_backends.hpp"
#include "kernel_reference.hpp"
#include "pipetrain/backend/backend.hpp"
#include "pipetrain/core/documents.hpp"
#include "pipetrain/core/dtype.hpp"

namespace pipetrain {
namespace {

using ref::max_abs;
using ref::random_vec;
using ref::Vec;
using testing::close;
using testing::DevBuf;

using Ints = std::vector<int32_t>;
using Docs = std::vector<std::vector<int>>;  // each sequence's document lengths (summing to T)

Ints positions_of(const Docs& docs) {
  Ints p;
  for (const auto& seq : docs)
    for (int len : seq)
      for (int i = 0; i < len; ++i) p.push_back(i);
  return p;
}

// Rows [row, row + n) of width w.
Vec rows(const Vec& v, size_t row, size_t n, size_t w) {
  return Vec(v.begin() + static_cast<std::ptrdiff_t>(row * w), v.begin() + static_cast<std::ptrdiff_t>((row + n) * w));
}

class KernelDocumentsTest : public testing::BackendTest {
 protected:
  // Attention forward and backward; positions null: plain causal.
  void attention(const Vec& qkv, const Vec& dout, int B, int T, int C, int NH, int NKV, DType storage,
                 const Ints* positions, Vec& out, Vec& dqkv) {
    auto pool = MemoryPool::create(be());
    DevBuf<float> q(be(), qkv), o(be(), Vec(size_t(B) * T * C, 5.0f)), d(be(), dout),
        dq(be(), Vec(qkv.size(), std::numeric_limits<float>::quiet_NaN()));
    DevBuf<int32_t> pos(be(), positions ? *positions : Ints{});
    const int32_t* p = positions ? pos.get() : nullptr;
    auto stash = be().attention_forward(o.get(), q.get(), B, T, C, NH, NKV, *pool, storage, p);
    be().attention_backward(dq.get(), d.get(), q.get(), *stash, B, T, C, NH, NKV, *pool, p);
    out = o.host();
    dqkv = dq.host();
  }
};

INSTANTIATE_TEST_SUITE_P(Backends, KernelDocumentsTest, ::testing::ValuesIn(testing::backend_factories()),
                         testing::factory_name);

// Documents across query blocks (64 rows) and one-token ones; grouped-query heads; the
// second sequence one document (plain causal). Each document's output and gradients are
// those of the document run alone, whatever its neighbours hold.
TEST_P(KernelDocumentsTest, AttentionSeesOnlyItsDocument) {
  const int T = 131, C = 32, NH = 4, NKV = 2, hs = C / NH, R = C + 2 * NKV * hs;
  const Docs docs = {{5, 70, 1, 3, 52}, {131}};
  const int B = static_cast<int>(docs.size());
  const Ints positions = positions_of(docs);
  const Vec qkv = random_vec(size_t(B) * T * R, 90, -2.0f, 2.0f), dout = random_vec(size_t(B) * T * C, 91);
  // bf16 storage rounds the probabilities: a packed row and the row alone may round apart
  // by one bf16 step (2^-8 relative) of values up to 1, times |v| <= 2 summed over keys.
  for (DType storage : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(storage == DType::F32 ? "f32 storage" : "bf16 storage");
    const double tol = storage == DType::F32 ? 1e-5 : 3e-2;
    Vec out, dqkv;
    attention(qkv, dout, B, T, C, NH, NKV, storage, &positions, out, dqkv);
    size_t row = 0;
    for (const auto& seq : docs)
      for (int len : seq) {
        SCOPED_TRACE(::testing::Message() << "the document of " << len << " tokens at row " << row);
        Vec alone_out, alone_dqkv;
        attention(rows(qkv, row, len, R), rows(dout, row, len, C), 1, len, C, NH, NKV, storage, nullptr, alone_out,
                  alone_dqkv);
        EXPECT_TRUE(close(rows(out, row, len, C), alone_out, tol, tol * max_abs(alone_out)));
        EXPECT_TRUE(close(rows(dqkv, row, len, R), alone_dqkv, tol, tol * max_abs(alone_dqkv)));
        row += static_cast<size_t>(len);
      }
  }
}

TEST_P(KernelDocumentsTest, RopeTurnsByThePlaceInTheDocument) {
  const int T = 12, hs = 8, heads = 3, ld = heads * hs + 5;
  const Docs docs = {{4, 8}, {1, 6, 5}};
  const int B = static_cast<int>(docs.size());
  const Ints positions = positions_of(docs);
  const Vec x = random_vec(size_t(B) * T * ld, 92, -2.0f, 2.0f);
  DevBuf<float> d(be(), x);
  DevBuf<int32_t> pos(be(), positions);
  be().rope(d.get(), B, T, ld, heads, hs, 10000.0f, false, 0, pos.get());
  const Vec got = d.host();
  size_t row = 0;
  for (const auto& seq : docs)
    for (int len : seq) {
      DevBuf<float> alone(be(), rows(x, row, len, ld));
      be().rope(alone.get(), 1, len, ld, heads, hs, 10000.0f, false);
      EXPECT_EQ(rows(got, row, len, ld), alone.host()) << "the document at row " << row;
      row += static_cast<size_t>(len);
    }
}

// Positions past the rows' count (context parallelism's global ones: chunks 0 and 3 of a
// sequence of 8 on 4 rows) turn the rows as those rows of the whole sequence.
TEST_P(KernelDocumentsTest, RopeTurnsByGlobalPositionsPastTheRows) {
  const int hs = 8, heads = 2, ld = heads * hs;
  const Vec whole = random_vec(size_t(8) * ld, 98, -2.0f, 2.0f);
  const Ints mine = {0, 1, 6, 7};
  Vec part;
  for (int32_t t : mine) {
    const Vec r = rows(whole, size_t(t), 1, ld);
    part.insert(part.end(), r.begin(), r.end());
  }
  DevBuf<float> all(be(), whole), some(be(), part);
  DevBuf<int32_t> pos(be(), mine);
  be().rope(all.get(), 1, 8, ld, heads, hs, 10000.0f, false);
  be().rope(some.get(), 1, 4, ld, heads, hs, 10000.0f, false, 0, pos.get());
  const Vec a = all.host(), s = some.host();
  for (size_t i = 0; i < mine.size(); ++i)
    EXPECT_EQ(rows(s, i, 1, ld), rows(a, size_t(mine[i]), 1, ld)) << "position " << mine[i];
}

TEST_P(KernelDocumentsTest, PositionEmbeddingsAtThePlaceInTheDocument) {
  const int T = 9, C = 21;
  const Docs docs = {{3, 6}, {9}, {2, 2, 5}};
  const int B = static_cast<int>(docs.size());
  const Ints positions = positions_of(docs);
  const Vec wpe = random_vec(size_t(T) * C, 93), x = random_vec(size_t(B) * T * C, 94);
  DevBuf<float> out(be(), x), table(be(), wpe);
  DevBuf<int32_t> pos(be(), positions);
  be().position_add(out.get(), table.get(), B, T, C, pos.get());
  Vec want = x;
  for (size_t n = 0; n < positions.size(); ++n)
    for (int c = 0; c < C; ++c) want[n * C + c] += wpe[size_t(positions[n]) * C + c];
  EXPECT_EQ(out.host(), want);

  const Vec dout = random_vec(x.size(), 95), g0 = random_vec(wpe.size(), 96);
  std::vector<double> g_ref(g0.begin(), g0.end());
  for (size_t n = 0; n < positions.size(); ++n)
    for (int c = 0; c < C; ++c) g_ref[size_t(positions[n]) * C + c] += dout[n * C + c];
  DevBuf<float> g(be(), g0), d(be(), dout);
  be().position_backward(g.get(), d.get(), B, T, C, pos.get());
  EXPECT_TRUE(close(g.host(), g_ref, 1e-6, 1e-6));  // at most 5 terms per element
}

// An ignored target: loss 0 and a 0 gradient row; the other rows as without it. The fused
// kernel and the three phases of the vocabulary-parallel one (one shard holding it all).
TEST_P(KernelDocumentsTest, IgnoredTargetsTakePartNowhere) {
  const int N = 7, V = 301, Vp = 320;
  const Vec logits = random_vec(size_t(N) * Vp, 97, -4.0f, 4.0f);
  Ints t = {3, kIgnoredTarget, 300, 0, kIgnoredTarget, 17, kIgnoredTarget};
  Ints all = t;
  for (int32_t& x : all)
    if (x == kIgnoredTarget) x = 5;
  auto fused = [&](const Ints& targets, Vec& grad) {
    DevBuf<float> l(be(), logits), loss(be(), Vec(N, 9.0f));
    DevBuf<int32_t> dt(be(), targets);
    be().crossentropy_forward(loss.get(), l.get(), dt.get(), N, V, Vp, 0.5f);
    grad = l.host();
    return loss.host();
  };
  auto phases = [&](const Ints& targets, Vec& grad) {
    DevBuf<float> l(be(), logits), loss(be(), Vec(N, 9.0f)), mx(be(), Vec(N)), sums(be(), Vec(2 * N));
    DevBuf<int32_t> dt(be(), targets);
    be().crossentropy_local_max(mx.get(), l.get(), N, Vp, 0, V);
    be().crossentropy_local_sums(sums.get(), sums.get() + N, l.get(), mx.get(), dt.get(), N, Vp, 0, V);
    be().crossentropy_finish(loss.get(), l.get(), mx.get(), sums.get(), sums.get() + N, dt.get(), N, Vp, 0, V, 0.5f);
    grad = l.host();
    return loss.host();
  };
  for (int form = 0; form < 2; ++form) {
    SCOPED_TRACE(form == 0 ? "fused" : "phases");
    Vec grad, grad_all;
    const Vec loss = form == 0 ? fused(t, grad) : phases(t, grad);
    const Vec loss_all = form == 0 ? fused(all, grad_all) : phases(all, grad_all);
    for (int n = 0; n < N; ++n) {
      const bool ignored = t[size_t(n)] == kIgnoredTarget;
      EXPECT_EQ(loss[size_t(n)], ignored ? 0.0f : loss_all[size_t(n)]) << "row " << n;
      for (int v = 0; v < Vp; ++v)
        ASSERT_EQ(grad[size_t(n) * Vp + v], ignored ? 0.0f : grad_all[size_t(n) * Vp + v]) << "row " << n;
    }
  }
}

}  // namespace
}  // namespace pipetrain
