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

// Rows `blocks` (in their order) of each of B sequences of T rows of `ld` floats: `width`
// floats from column `col`.
Vec rows_of(const std::vector<Block>& blocks, const Vec& from, int B, int T, int ld, int col, int width) {
  Vec out;
  for (int b = 0; b < B; ++b)
    for (const Block& k : blocks)
      for (int t = k.first; t < k.first + k.n; ++t)
        for (int c = 0; c < width; ++c) out.push_back(from[(size_t(b) * T + t) * ld + col + c]);
  return out;
}

// The keys of a sequence of T in `blocks` (any order), attended to one by one and merged,
// for the queries of `queries` (empty: every row; else runs of rows, as a context-parallel
// rank's chunks). `documents`: the lengths of packed documents filling the sequence (empty:
// one), whose queries see their own document's keys only (qstart, against the causal
// kernel's positions). The reference's output gradient is 0 outside the queries, so its
// key and value gradients are theirs alone.
void expect_blocks_make_the_whole(Backend& be, int T, const std::vector<Block>& blocks,
                                  const std::vector<int>& documents = {}, std::vector<Block> queries = {}) {
  const int B = 2, NH = 4, NKV = 2, hs = 8, C = NH * hs, Ckv = NKV * hs, R = C + 2 * Ckv;
  if (queries.empty()) queries = {{0, T}};
  int Tq = 0;
  for (const Block& k : queries) Tq += k.n;
  auto be_ = [&be]() -> Backend& { return be; };
  const Vec qkv = random_vec(size_t(B) * T * R, 101, -2.0f, 2.0f);
  Vec dout(size_t(B) * T * C, 0.0f);
  const Vec some = random_vec(dout.size(), 102);
  auto pool = MemoryPool::create(be_());
  std::vector<int32_t> doc_pos(size_t(B) * T), qpos, qstart;
  for (int b = 0, t = 0; b < B; ++b, t = 0)  // each document's positions count from 0
    for (int len : documents.empty() ? std::vector<int>{T} : documents)
      for (int i = 0; i < len; ++i, ++t) doc_pos[size_t(b) * T + t] = i;
  for (int b = 0; b < B; ++b)
    for (const Block& k : queries)
      for (int t = k.first; t < k.first + k.n; ++t) {
        qpos.push_back(t);
        qstart.push_back(t - doc_pos[size_t(b) * T + t]);
        for (int c = 0; c < C; ++c) dout[(size_t(b) * T + t) * C + c] = some[(size_t(b) * T + t) * C + c];
      }
  // The reference: the causal kernel on the whole sequence (checked against the naive one).
  DevBuf<float> whole(be_(), qkv), ref_out(be_(), Vec(size_t(B) * T * C)), ref_d(be_(), dout),
      ref_dq(be_(), Vec(qkv.size()));
  DevBuf<int32_t> positions(be_(), doc_pos), qp(be_(), qpos), qs(be_(), qstart);
  const int32_t* by_document = documents.empty() ? nullptr : positions.get();
  auto stash = be_().attention_forward(ref_out.get(), whole.get(), B, T, C, NH, NKV, *pool, DType::F32, by_document);
  be_().attention_backward(ref_dq.get(), ref_d.get(), whole.get(), *stash, B, T, C, NH, NKV, *pool, by_document);
  const Vec want_out = rows_of(queries, ref_out.host(), B, T, C, 0, C), want_dqkv = ref_dq.host();
  const int32_t* starts = documents.empty() ? nullptr : qs.get();

  DevBuf<float> q(be_(), rows_of(queries, qkv, B, T, R, 0, R)), d(be_(), rows_of(queries, dout, B, T, C, 0, C));
  DevBuf<float> out(be_(), Vec(size_t(B) * Tq * C, 0.0f)), lse(be_(), Vec(size_t(B) * NH * Tq, -INFINITY)),
      bo(be_(), Vec(size_t(B) * Tq * C)), bl(be_(), Vec(size_t(B) * NH * Tq));
  auto keys_of = [&](const Block& k) {
    std::vector<int32_t> kp;
    for (int b = 0; b < B; ++b)
      for (int t = k.first; t < k.first + k.n; ++t) kp.push_back(t);
    return kp;
  };
  for (const Block& k : blocks) {
    DevBuf<float> kv(be_(), rows_of({k}, qkv, B, T, R, C, 2 * Ckv));
    DevBuf<int32_t> kd(be_(), keys_of(k));
    be_().attention_block_forward(bo.get(), bl.get(), q.get(), R, kv.get(), kv.get() + Ckv, 2 * Ckv, qp.get(), starts,
                                  kd.get(), B, Tq, k.n, NH, NKV, hs, *pool);
    be_().attention_merge(out.get(), lse.get(), bo.get(), bl.get(), B, Tq, NH, hs);
  }
  // f32 sums in another order: as the causal kernel's own bound against the reference.
  EXPECT_TRUE(close(out.host(), want_out, 1e-5, 1e-6 * max_abs(want_out)));

  DevBuf<float> delta(be_(), Vec(size_t(B) * NH * Tq)), dq(be_(), Vec(size_t(B) * Tq * R, 0.0f));
  be_().attention_delta(delta.get(), d.get(), out.get(), B, Tq, NH, hs);
  Vec got_dkv(size_t(B) * T * 2 * Ckv, 0.0f);
  for (const Block& k : blocks) {
    DevBuf<float> kv(be_(), rows_of({k}, qkv, B, T, R, C, 2 * Ckv)), dkv(be_(), Vec(size_t(B) * k.n * 2 * Ckv, 0.0f));
    DevBuf<int32_t> kd(be_(), keys_of(k));
    be_().attention_block_backward(dq.get(), R, dkv.get(), dkv.get() + Ckv, 2 * Ckv, d.get(), delta.get(), lse.get(),
                                   q.get(), R, kv.get(), kv.get() + Ckv, 2 * Ckv, qp.get(), starts, kd.get(), B, Tq,
                                   k.n, NH, NKV, hs, *pool);
    const Vec g = dkv.host();
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < k.n; ++t)
        for (int c = 0; c < 2 * Ckv; ++c)
          got_dkv[(size_t(b) * T + k.first + t) * 2 * Ckv + c] = g[(size_t(b) * k.n + t) * 2 * Ckv + c];
  }
  const Vec want_dq = rows_of(queries, want_dqkv, B, T, R, 0, C),
            want_dkv = rows_of({{0, T}}, want_dqkv, B, T, R, C, 2 * Ckv);
  EXPECT_TRUE(close(rows_of({{0, Tq}}, dq.host(), B, Tq, R, 0, C), want_dq, 1e-4, 1e-5 * max_abs(want_dq)));
  EXPECT_TRUE(close(got_dkv, want_dkv, 1e-4, 1e-5 * max_abs(want_dkv)));

  // A block entirely after every query: nothing visible, nothing changes.
  const Vec before = out.host(), lse_before = lse.host();
  std::vector<int32_t> late(size_t(B) * 3, T + 5);
  DevBuf<int32_t> ld(be_(), late);
  DevBuf<float> kv(be_(), random_vec(size_t(B) * 3 * 2 * Ckv, 103));
  be_().attention_block_forward(bo.get(), bl.get(), q.get(), R, kv.get(), kv.get() + Ckv, 2 * Ckv, qp.get(), starts,
                                ld.get(), B, Tq, 3, NH, NKV, hs, *pool);
  be_().attention_merge(out.get(), lse.get(), bo.get(), bl.get(), B, Tq, NH, hs);
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
  // The ring's shapes: 512 tokens over cp 2, a rank's queries (chunks 0 and 3, or 1 and 2,
  // two 64-query blocks each) against every rank's chunks, with and without documents
  // across them.
  const std::vector<Block> ring = {{0, 128}, {384, 128}, {128, 128}, {256, 128}};
  expect_blocks_make_the_whole(be(), 512, ring, {}, {{0, 128}, {384, 128}});
  expect_blocks_make_the_whole(be(), 512, ring, {100, 200, 60, 152}, {{0, 128}, {384, 128}});
  expect_blocks_make_the_whole(be(), 512, ring, {100, 200, 60, 152}, {{128, 128}, {256, 128}});
}

}  // namespace
}  // namespace pipetrain
