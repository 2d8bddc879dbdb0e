// The kernel harness for attention (causal, grouped-query, bf16 storage, the CPU's
// block-by-block stash): every backend in backend_factories() against the naive
// double-precision references of kernel_reference.hpp, and its backward against central
// finite differences of its own forward.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "fd_check.hpp"
#include "kernel_backends.hpp"
#include "kernel_reference.hpp"
#include "pipetrain/backend/attention.hpp"
#include "pipetrain/backend/backend.hpp"
#include "pipetrain/backend/bf16_products.hpp"
#include "pipetrain/core/dtype.hpp"

namespace pipetrain {
namespace {

using ref::dot;
using ref::DVec;
using ref::max_abs;
using ref::random_vec;
using ref::Vec;
using testing::close;
using testing::DevBuf;
using testing::fd_check;

class KernelAttentionTest : public testing::BackendTest {
 protected:
  // Runs the backend's attention forward (and backward, given dout); returns out and
  // (then) dqkv. The stash is the backend's own, from a pool.
  Vec attention_out(const Vec& qkv, int B, int T, int C, int NH, const Vec* dout = nullptr, Vec* dqkv = nullptr,
                    int NKV = 0, DType storage = DType::F32) {
    if (NKV == 0) NKV = NH;
    auto pool = MemoryPool::create(be());
    DevBuf<float> q(be(), qkv), out(be(), Vec(size_t(B) * T * C, 5.0f));
    auto stash = be().attention_forward(out.get(), q.get(), B, T, C, NH, NKV, *pool, storage);
    if (dout) {
      DevBuf<float> d(be(), *dout), dq(be(), Vec(qkv.size(), std::numeric_limits<float>::quiet_NaN()));
      be().attention_backward(dq.get(), d.get(), q.get(), *stash, B, T, C, NH, NKV, *pool);
      *dqkv = dq.host();
    }
    return out.host();
  }
  Vec attention_dqkv(const Vec& qkv, const Vec& dout, int B, int T, int C, int NH) {
    Vec dqkv;
    attention_out(qkv, B, T, C, NH, &dout, &dqkv);
    return dqkv;
  }
};

INSTANTIATE_TEST_SUITE_P(Backends, KernelAttentionTest, ::testing::ValuesIn(testing::backend_factories()),
                         testing::factory_name);

struct AttnShape {
  int B, T, C, NH;
};

TEST_P(KernelAttentionTest, Attention) {
  // T not a multiple of the query block (64), exactly one block, tiny T.
  for (AttnShape s : {AttnShape{2, 131, 48, 4}, AttnShape{1, 64, 32, 2}, AttnShape{3, 5, 12, 3}}) {
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C);
    const Vec qkv = random_vec(size_t(s.B) * s.T * 3 * s.C, 7, -2.0f, 2.0f);
    DVec out_ref, att_ref;
    ref::attention_forward(out_ref, att_ref, qkv, s.B, s.T, s.C, s.NH);
    const Vec out = attention_out(qkv, s.B, s.T, s.C, s.NH);
    EXPECT_TRUE(close(out, out_ref, 1e-5, 1e-6 * max_abs(out_ref)));
    // Causality: changing the last token's q, k and v changes no earlier output.
    Vec later = qkv;
    for (int b = 0; b < s.B; ++b)
      for (int c = 0; c < 3 * s.C; ++c) later[(size_t(b) * s.T + s.T - 1) * 3 * s.C + c] += 1.0f;
    const Vec out_later = attention_out(later, s.B, s.T, s.C, s.NH);
    for (int b = 0; b < s.B; ++b)
      for (int t = 0; t + 1 < s.T; ++t)
        for (int c = 0; c < s.C; ++c) {
          const size_t i = (size_t(b) * s.T + t) * s.C + c;
          ASSERT_EQ(out[i], out_later[i]) << "output of token " << t << " depends on a later token";
        }

    const Vec dout = random_vec(out.size(), 8);
    DVec dqkv_ref;
    ref::attention_backward(dqkv_ref, dout, qkv, s.B, s.T, s.C, s.NH);
    // dqkv starts as NaN: the kernel must overwrite every element.
    EXPECT_TRUE(close(attention_dqkv(qkv, dout, s.B, s.T, s.C, s.NH), dqkv_ref, 1e-4,
                      1e-5 * max_abs(dqkv_ref)));
  }
}

TEST_P(KernelAttentionTest, GradCheckAttention) {
  const int B = 2, T = 67, C = 8, NH = 2;  // crosses a query-block boundary
  const Vec qkv = random_vec(size_t(B) * T * 3 * C, 32), R = random_vec(size_t(B) * T * C, 33);
  const Vec an = attention_dqkv(qkv, R, B, T, C, NH);
  EXPECT_TRUE(fd_check(qkv, an, [&](const Vec& x) {
    return dot(attention_out(x, B, T, C, NH), R);
  }));
}

struct GqaShape {
  int B, T, C, NH, NKV;  // NKV key/value heads (NKV divides NH)
};

TEST_P(KernelAttentionTest, GroupedQueryAttention) {
  // Two query heads per key/value head; multi-query (one K/V head for all six).
  for (GqaShape s : {GqaShape{2, 37, 32, 4, 2}, GqaShape{1, 70, 24, 6, 1}}) {
    SCOPED_TRACE(::testing::Message() << "NH=" << s.NH << " NKV=" << s.NKV << " T=" << s.T);
    const int hs = s.C / s.NH, R = s.C + 2 * s.NKV * hs;
    const Vec qkv = random_vec(size_t(s.B) * s.T * R, 60, -2.0f, 2.0f);
    DVec out_ref, att_ref, dqkv_ref;
    ref::attention_forward(out_ref, att_ref, qkv, s.B, s.T, s.C, s.NH, s.NKV);
    const Vec dout = random_vec(out_ref.size(), 61);
    ref::attention_backward(dqkv_ref, dout, qkv, s.B, s.T, s.C, s.NH, s.NKV);
    Vec dqkv;  // starts as NaN: every element must be written
    const Vec out = attention_out(qkv, s.B, s.T, s.C, s.NH, &dout, &dqkv, s.NKV);
    EXPECT_TRUE(close(out, out_ref, 1e-5, 1e-6 * max_abs(out_ref)));
    EXPECT_TRUE(close(dqkv, dqkv_ref, 1e-4, 1e-5 * max_abs(dqkv_ref)));
  }
  const int B = 1, T = 9, C = 8, NH = 4, NKV = 2, R = C + 2 * NKV * (C / NH);
  const Vec qkv = random_vec(size_t(B) * T * R, 62), Rv = random_vec(size_t(B) * T * C, 63);
  Vec an;
  attention_out(qkv, B, T, C, NH, &Rv, &an, NKV);
  EXPECT_TRUE(fd_check(qkv, an, [&](const Vec& x) { return dot(attention_out(x, B, T, C, NH, nullptr, nullptr, NKV), Rv); }));
}

// bf16 storage: the stash keeps the probabilities in bf16, and where the backend multiplies
// bf16 natively (cpu_onednn, CUDA) attention's products take bf16 operands (P, dO, dS
// rounded). Every element is within the bf16 bound of
// ref::attention_bf16_bounds (4u times its bound, u = 2^-9) plus f32's share (sums of at
// most T terms and the scores' dot products: T 2^-23 of the bound).
TEST_P(KernelAttentionTest, AttentionWithBf16Storage) {
  for (GqaShape s : {GqaShape{2, 131, 48, 4, 4}, GqaShape{1, 70, 24, 6, 2}}) {
    SCOPED_TRACE(::testing::Message() << "NH=" << s.NH << " NKV=" << s.NKV << " T=" << s.T);
    const int hs = s.C / s.NH, R = s.C + 2 * s.NKV * hs;
    Vec qkv = random_vec(size_t(s.B) * s.T * R, 66, -2.0f, 2.0f);
    for (float& x : qkv) x = to_float(to_bf16(x));  // a block passes its stored (bf16) qkv
    const Vec dout = random_vec(size_t(s.B) * s.T * s.C, 67);
    DVec out_ref, att_ref, dqkv_ref, out_bound, dqkv_bound;
    ref::attention_forward(out_ref, att_ref, qkv, s.B, s.T, s.C, s.NH, s.NKV);
    ref::attention_backward(dqkv_ref, dout, qkv, s.B, s.T, s.C, s.NH, s.NKV);
    ref::attention_bf16_bounds(out_bound, dqkv_bound, dout, qkv, s.B, s.T, s.C, s.NH, s.NKV);
    const long onednn_before = onednn_products_run();
    Vec dqkv;
    const Vec out = attention_out(qkv, s.B, s.T, s.C, s.NH, &dout, &dqkv, s.NKV, DType::BF16);
    const double factor = 4.0 * std::ldexp(1.0, -9) + std::max(s.T, hs) * std::ldexp(1.0, -23);
    auto within = [&](const Vec& got, const DVec& want, const DVec& bound) {
      for (size_t i = 0; i < got.size(); ++i)
        if (!(std::abs(got[i] - want[i]) <= factor * bound[i] + 1e-30))
          return ::testing::AssertionFailure() << "element " << i << ": " << got[i] << " against " << want[i]
                                               << ", bound " << factor * bound[i];
      return ::testing::AssertionSuccess();
    };
    EXPECT_TRUE(within(out, out_ref, out_bound));
    EXPECT_TRUE(within(dqkv, dqkv_ref, dqkv_bound));
    // Its products went to oneDNN exactly where the backend multiplies bf16 through it.
    const bool onednn = be().name().find("bf16 products: oneDNN") != std::string::npos;
    EXPECT_EQ(onednn_products_run() > onednn_before, onednn) << be().name();
  }
}

// qkv handed over as a bf16 run stores it (Backend's bf16-qkv forms): the same results, bit
// for bit, as its values widened to f32 — on the path that widens it and on the one that
// multiplies it as bf16 (cpu_onednn).
TEST_P(KernelAttentionTest, StoredBf16QkvGivesWhatItsWidenedValuesGive) {
  const int B = 2, T = 70, C = 24, NH = 6, NKV = 2, R = C + 2 * NKV * (C / NH);
  Vec qkv = random_vec(size_t(B) * T * R, 69, -2.0f, 2.0f);
  std::vector<bf16> stored(qkv.size());
  for (size_t i = 0; i < qkv.size(); ++i) stored[i] = to_bf16(qkv[i]), qkv[i] = to_float(stored[i]);
  const Vec dout = random_vec(size_t(B) * T * C, 70);
  for (DType storage : {DType::BF16, DType::F32}) {
    SCOPED_TRACE(dtype_name(storage));
    auto pool = MemoryPool::create(be());
    DevBuf<float> wide(be(), qkv), d(be(), dout);
    DevBuf<bf16> half(be(), stored);
    DevBuf<float> out_w(be(), Vec(size_t(B) * T * C)), out_h(be(), Vec(size_t(B) * T * C));
    DevBuf<float> dq_w(be(), Vec(qkv.size(), std::numeric_limits<float>::quiet_NaN()));
    DevBuf<float> dq_h(be(), Vec(qkv.size(), std::numeric_limits<float>::quiet_NaN()));
    auto sw = be().attention_forward(out_w.get(), wide.get(), B, T, C, NH, NKV, *pool, storage);
    auto sh = be().attention_forward(out_h.get(), static_cast<const bf16*>(half.get()), B, T, C, NH, NKV, *pool,
                                     storage);
    EXPECT_TRUE(close(out_h.host(), out_w.host(), 0, 0));
    be().attention_backward(dq_w.get(), d.get(), wide.get(), *sw, B, T, C, NH, NKV, *pool);
    be().attention_backward(dq_h.get(), d.get(), static_cast<const bf16*>(half.get()), *sh, B, T, C, NH, NKV, *pool);
    EXPECT_TRUE(close(dq_h.host(), dq_w.host(), 0, 0));
  }
}

// The CPU keeps each (sequence, head)'s probabilities block by block without the causal
// upper triangle: causal_block_elements(T) of them, in the storage precision.
TEST(AttentionBlocks, KeptElementsAreTheBlocksRowsTimesKeys) {
  for (int T = 1; T <= 300; ++T) {
    int64_t sum = 0;
    for (int i0 = 0; i0 < T; i0 += kAttnBlock) {
      ASSERT_EQ(causal_block_offset(i0), sum) << "T=" << T << " i0=" << i0;
      const int i1 = std::min(i0 + kAttnBlock, T);
      sum += int64_t{i1 - i0} * i1;
    }
    ASSERT_EQ(causal_block_elements(T), sum) << "T=" << T;
  }
  EXPECT_EQ(causal_block_elements(256), 256 * 256 * 5 / 8);  // blocks of 64: 1 + 2 + 3 + 4 of 16
  EXPECT_EQ(causal_block_elements(64), 64 * 64);
  EXPECT_EQ(causal_block_elements(0), 0);
}

TEST_P(KernelAttentionTest, AttentionKeepsCausalBlocksOnTheCpu) {
  if (be().device().kind != DeviceKind::Host) GTEST_SKIP() << "the CUDA backend keeps its own stash";
  for (DType storage : {DType::F32, DType::BF16})
    for (int T : {5, 131, 256}) {
      const int B = 2, C = 24, NH = 3;
      auto pool = MemoryPool::create(be());
      DevBuf<float> q(be(), random_vec(size_t(B) * T * 3 * C, 68)), out(be(), Vec(size_t(B) * T * C));
      const auto stash = be().attention_forward(out.get(), q.get(), B, T, C, NH, NH, *pool, storage);
      EXPECT_EQ(stash->bytes(), size_t(B) * NH * causal_block_elements(T) * dtype_size(storage))
          << "T=" << T << " " << dtype_name(storage);
    }
}

}  // namespace
}  // namespace pipetrain
