// Ring attention over the world's ranks (model/ring_attention.hpp): a sequence cut into
// 2 x ranks chunks, rank i holding chunks i and 2 ranks - 1 - i, attended around the ring,
// gives every rank's rows of the single-rank causal attention, output and qkv gradients.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "mpi/mpi_fixtures.hpp"
#include "pipetrain/comm/mpi_communicator.hpp"
#include "pipetrain/core/rng.hpp"
#include "pipetrain/model/ring_attention.hpp"

namespace pipetrain {
namespace {

using namespace testing;

std::vector<float> random_floats(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(rng.normal());
  return v;
}

TEST(RingAttention, EveryRankHasItsRowsOfTheWholeAttention) {
  const int cp = world_size(), me = world_rank();
  const int B = 2, T = 2 * cp * 9, NH = 4, NKV = 2, hs = 8, C = NH * hs, R = (NH + 2 * NKV) * hs;
  auto backend = make_cpu_backend();
  auto pool = MemoryPool::create(*backend);
  const std::vector<float> qkv = random_floats(size_t(B) * T * R, 7), dout = random_floats(size_t(B) * T * C, 8);
  // The single-rank reference.
  Tensor q = Tensor::empty(*pool, {int64_t{B} * T, R}), o = Tensor::empty(*pool, {int64_t{B} * T, C}),
         d = Tensor::empty(*pool, {int64_t{B} * T, C}), dq = Tensor::empty(*pool, {int64_t{B} * T, R});
  std::copy(qkv.begin(), qkv.end(), q.f32());
  std::copy(dout.begin(), dout.end(), d.f32());
  auto stash = backend->attention_forward(o.f32(), q.f32(), B, T, C, NH, NKV, *pool, DType::F32);
  backend->attention_backward(dq.f32(), d.f32(), q.f32(), *stash, B, T, C, NH, NKV, *pool);

  // This rank's rows, the ring, and its rows of the reference.
  MpiCommunicator comm(MPI_COMM_WORLD, "cp");
  RingAttention ring(comm, *backend, *pool, B, T, NH, NKV, hs);
  const std::vector<int32_t> mine = ring_positions(T, cp, me);
  const int Tl = static_cast<int>(mine.size());
  Tensor lq = Tensor::empty(*pool, {int64_t{B} * Tl, R}), ld = Tensor::empty(*pool, {int64_t{B} * Tl, C});
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < Tl; ++i) {
      const size_t from = size_t(b) * T + mine[size_t(i)], to = size_t(b) * Tl + i;
      std::copy(q.f32() + from * R, q.f32() + (from + 1) * R, lq.f32() + to * R);
      std::copy(d.f32() + from * C, d.f32() + (from + 1) * C, ld.f32() + to * C);
    }
  Tensor lo = Tensor::empty(*pool, {int64_t{B} * Tl, C}), ldq = Tensor::empty(*pool, {int64_t{B} * Tl, R});
  ring.forward(lq, lo);
  ring.backward(lq, ld, ldq);
  // f32 sums in another order: the kernel harness's bounds for attention (1e-5 forward,
  // 1e-4 backward relative, plus 1e-6 / 1e-5 of the largest).
  double omax = 0, gmax = 0;
  for (int64_t i = 0; i < o.numel(); ++i) omax = std::max(omax, std::abs(double(o.f32()[i])));
  for (int64_t i = 0; i < dq.numel(); ++i) gmax = std::max(gmax, std::abs(double(dq.f32()[i])));
  int bad = 0;
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < Tl; ++i) {
      const size_t g = size_t(b) * T + mine[size_t(i)], l = size_t(b) * Tl + i;
      for (int c = 0; c < C; ++c) {
        const double w = o.f32()[g * C + c], x = lo.f32()[l * C + c];
        bad += !(std::abs(x - w) <= 1e-5 * std::abs(w) + 1e-6 * omax);
      }
      for (int c = 0; c < R; ++c) {
        const double w = dq.f32()[g * R + c], x = ldq.f32()[l * R + c];
        bad += !(std::abs(x - w) <= 1e-4 * std::abs(w) + 1e-5 * gmax);
      }
    }
  EXPECT_EQ(bad, 0) << "rank " << me << " of " << cp << ": " << bad << " values off the single-rank attention";
}

}  // namespace
}  // namespace pipetrain
