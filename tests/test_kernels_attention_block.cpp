// Attention against blocks of keys by global positions (Backend::attention_block_*, the
// ring's kernels): the keys cut into blocks, each attended to alone and merged by
// log-sum-exp, give the causal attention of the whole sequence, forward and backward, and
// with packed documents (each query's keys from its document's start) the block-diagonal
// one; a block no query may see changes nothing. Every backend.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "kernel_backends.hpp"
#include "kernel_reference.hpp"
#include "pipetrain/backend/backend.hpp"

namespace pipetrain {
namespace {

using ref::max_abs;
using ref::random_vec;
using ref::Vec;
using testing::close;
using testing::DevBuf;

class KernelAttentionBlockTest : public testing::BackendTest {};

INSTANTIATE_TEST_SUITE_P(Backends, KernelAttentionBlockTest, ::testing::ValuesIn(testing::backend_factories()),
                         testing::factory_name);

struct Block {
  int first, n;
};

// The keys of a sequence of T in `blocks` (any order), attended to one by one and merged.
// `documents`: the lengths of packed documents filling the sequence (empty: one), whose
// queries see their own document's keys only (qstart, against the causal kernel's positions).
void expect_blocks_make_the_whole(Backend& be, int T, const std::vector<Block>& blocks,
                                  const std::vector<int>& documents = {}) {
  const int B = 2, NH = 4, NKV = 2, hs = 8, C = NH * hs, Ckv = NKV * hs, R = C + 2 * Ckv;
  auto be_ = [&be]() -> Backend& { return be; };
  const Vec qkv = random_vec(size_t(B) * T * R, 101, -2.0f, 2.0f), dout = random_vec(size_t(B) * T * C, 102);
  auto pool = MemoryPool::create(be_());
  std::vector<int32_t> qpos(size_t(B) * T), doc_pos(size_t(B) * T), qstart(size_t(B) * T);
  for (int b = 0; b < B; ++b) std::iota(qpos.begin() + b * T, qpos.begin() + (b + 1) * T, 0);
  for (int b = 0, t = 0; b < B; ++b, t = 0)  // each document's positions count from 0
    for (int len : documents.empty() ? std::vector<int>{T} : documents)
      for (int i = 0; i < len; ++i, ++t) {
        doc_pos[size_t(b) * T + t] = i;
        qstart[size_t(b) * T + t] = t - i;
      }
  // The reference: the causal kernel on the whole sequence (checked against the naive one).
  DevBuf<float> q(be_(), qkv), ref_out(be_(), Vec(size_t(B) * T * C)), d(be_(), dout), ref_dq(be_(), Vec(qkv.size()));
  DevBuf<int32_t> positions(be_(), doc_pos), qp(be_(), qpos), qs(be_(), qstart);
  const int32_t* by_document = documents.empty() ? nullptr : positions.get();
  auto stash = be_().attention_forward(ref_out.get(), q.get(), B, T, C, NH, NKV, *pool, DType::F32, by_document);
  be_().attention_backward(ref_dq.get(), d.get(), q.get(), *stash, B, T, C, NH, NKV, *pool, by_document);
  const Vec want_out = ref_out.host(), want_dq = ref_dq.host();
  const int32_t* starts = documents.empty() ? nullptr : qs.get();
  auto block_of = [&](const Block& k, const Vec& from, int width, int col) {  // rows [first, first+n) of every sequence
    Vec out;
    for (int b = 0; b < B; ++b)
      for (int t = k.first; t < k.first + k.n; ++t)
        for (int c = 0; c < width; ++c) out.push_back(from[(size_t(b) * T + t) * R + col + c]);
    return out;
  };
  DevBuf<float> out(be_(), Vec(size_t(B) * T * C, 0.0f)), lse(be_(), Vec(size_t(B) * NH * T, -INFINITY)),
      bo(be_(), Vec(size_t(B) * T * C)), bl(be_(), Vec(size_t(B) * NH * T));
  std::vector<std::vector<int32_t>> kpos;
  for (const Block& k : blocks) {
    std::vector<int32_t> kp;
    for (int b = 0; b < B; ++b)
      for (int t = k.first; t < k.first + k.n; ++t) kp.push_back(t);
    kpos.push_back(kp);
    DevBuf<float> kv(be_(), block_of(k, qkv, 2 * Ckv, C));
    DevBuf<int32_t> kd(be_(), kp);
    be_().attention_block_forward(bo.get(), bl.get(), q.get(), R, kv.get(), kv.get() + Ckv, 2 * Ckv, qp.get(), starts,
                                  kd.get(), B, T, k.n, NH, NKV, hs, *pool);
    be_().attention_merge(out.get(), lse.get(), bo.get(), bl.get(), B, T, NH, hs);
  }
  // f32 sums in another order: as the causal kernel's own bound against the reference.
  EXPECT_TRUE(close(out.host(), want_out, 1e-5, 1e-6 * max_abs(want_out)));

  DevBuf<float> delta(be_(), Vec(size_t(B) * NH * T)), dq(be_(), Vec(qkv.size(), 0.0f));
  be_().attention_delta(delta.get(), d.get(), out.get(), B, T, NH, hs);
  Vec got_dq = Vec(qkv.size(), 0.0f);
  for (size_t i = 0; i < blocks.size(); ++i) {
    const Block& k = blocks[i];
    DevBuf<float> kv(be_(), block_of(k, qkv, 2 * Ckv, C)), dkv(be_(), Vec(size_t(B) * k.n * 2 * Ckv, 0.0f));
    DevBuf<int32_t> kd(be_(), kpos[i]);
    be_().attention_block_backward(dq.get(), R, dkv.get(), dkv.get() + Ckv, 2 * Ckv, d.get(), delta.get(), lse.get(),
                                   q.get(), R, kv.get(), kv.get() + Ckv, 2 * Ckv, qp.get(), starts, kd.get(), B, T, k.n,
                                   NH, NKV, hs, *pool);
    const Vec g = dkv.host();
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < k.n; ++t)
        for (int c = 0; c < 2 * Ckv; ++c)
          got_dq[(size_t(b) * T + k.first + t) * R + C + c] = g[(size_t(b) * k.n + t) * 2 * Ckv + c];
  }
  const Vec q_part = dq.host();
  for (size_t r = 0; r < size_t(B) * T; ++r)
    for (int c = 0; c < C; ++c) got_dq[r * R + c] = q_part[r * R + c];
  EXPECT_TRUE(close(got_dq, want_dq, 1e-4, 1e-5 * max_abs(want_dq)));

  // A block entirely after every query: nothing visible, nothing changes.
  const Vec before = out.host(), lse_before = lse.host();
  std::vector<int32_t> late(size_t(B) * 3, T + 5);
  DevBuf<int32_t> ld(be_(), late);
  DevBuf<float> kv(be_(), random_vec(size_t(B) * 3 * 2 * Ckv, 103));
  be_().attention_block_forward(bo.get(), bl.get(), q.get(), R, kv.get(), kv.get() + Ckv, 2 * Ckv, qp.get(), starts,
                                ld.get(), B, T, 3, NH, NKV, hs, *pool);
  be_().attention_merge(out.get(), lse.get(), bo.get(), bl.get(), B, T, NH, hs);
  EXPECT_EQ(out.host(), before);
  EXPECT_EQ(lse.host(), lse_before);
}

TEST_P(KernelAttentionBlockTest, BlocksMergedAreTheWholeCausalAttention) {
  // Three blocks of 13, 13 and 11 keys in scrambled order; and blocks longer than the
  // 64-query tiles, so that the diagonal block is cut into tiles of its own.
  expect_blocks_make_the_whole(be(), 37, {{13, 13}, {0, 13}, {26, 11}});
  expect_blocks_make_the_whole(be(), 150, {{70, 80}, {0, 70}});
  // Packed documents of 40, 50 and 60 tokens, the second across the blocks' cut.
  expect_blocks_make_the_whole(be(), 150, {{70, 80}, {0, 70}}, {40, 50, 60});
}

}  // namespace
}  // namespace pipetrain
