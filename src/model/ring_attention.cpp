// RingAttention (pipetrain/model/ring_attention.hpp).
#include "pipetrain/model/ring_attention.hpp"

#include <chrono>
#include <limits>
#include <utility>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/comm/communicator.hpp"
#include "pipetrain/core/error.hpp"

namespace pipetrain {
namespace {

// Tags of the ring's transfers: each step's key/value block forward and backward, the
// backward's travelling gradients, and their last hop home.
constexpr int kForwardTag = 0, kBackwardTag = 1 << 10, kGradTag = 2 << 10, kHomeTag = 3 << 10;

// Waits for a receive, adding the time blocked to `waited`.
void wait_for(CommRequest& received, Stream& stream, double& waited) {
  const auto t0 = std::chrono::steady_clock::now();
  received.wait_on(stream);
  waited += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Waits for a transfer pair, adding the time blocked to `waited`.
void finish(CommRequest& received, CommRequest& sent, Stream& stream, double& waited) {
  const auto t0 = std::chrono::steady_clock::now();
  received.wait_on(stream);
  sent.wait();
  waited += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

bool uses_ring(const MicrobatchContext& ctx) { return ctx.cp && ctx.cp->size() > 1 && !ctx.kv; }

std::vector<int32_t> ring_positions(int T, int cp, int rank) {
  if (cp < 1 || T % (2 * cp) != 0) fail("context parallelism: {} tokens do not cut into 2 x {} equal chunks", T, cp);
  const int c = T / (2 * cp);
  std::vector<int32_t> p;
  for (int chunk : {rank, 2 * cp - 1 - rank})
    for (int i = 0; i < c; ++i) p.push_back(chunk * c + i);
  return p;
}

RingAttention::RingAttention(Communicator& cp, Backend& backend, MemoryPool& pool, int B, int T, int NH, int NKV,
                             int hs, Tensor document_starts)
    : cp_(cp),
      be_(backend),
      pool_(pool),
      B_(B),
      T_(T),
      Tl_(T / cp.size()),
      NH_(NH),
      NKV_(NKV),
      hs_(hs),
      starts_(std::move(document_starts)) {
  for (int r = 0; r < cp.size(); ++r) positions_.push_back(positions_of(r));  // checks the cut
}

Tensor RingAttention::positions_of(int rank) const {
  const std::vector<int32_t> one = ring_positions(T_, cp_.size(), rank);
  std::vector<int32_t> all;
  for (int b = 0; b < B_; ++b) all.insert(all.end(), one.begin(), one.end());
  Tensor t = Tensor::empty(pool_, {static_cast<int64_t>(all.size())}, DType::I32);
  be_.to_device(t.raw(), all.data(), t.bytes());
  return t;
}

Tensor RingAttention::pack_kv(const Tensor& qkv) const {
  const int64_t R = (NH_ + 2 * NKV_) * hs_, kv = 2 * NKV_ * hs_, rows = local_rows();
  Tensor out = Tensor::empty(pool_, {rows, kv});
  for (int64_t r = 0; r < rows; ++r)
    be_.copy(out.f32() + r * kv, qkv.f32() + r * R + NH_ * hs_, static_cast<size_t>(kv) * sizeof(float));
  return out;
}

void RingAttention::forward(const Tensor& qkv, const Tensor& out) {
  const int cp = cp_.size(), me = cp_.rank(), R = (NH_ + 2 * NKV_) * hs_, Ckv = NKV_ * hs_;
  const int64_t rows = local_rows(), C = static_cast<int64_t>(NH_) * hs_;
  out_ = Tensor::empty(pool_, {rows, C});
  lse_ = Tensor::empty(pool_, {static_cast<int64_t>(B_) * NH_ * Tl_});
  be_.fill(out_.f32(), 0.0f, static_cast<size_t>(out_.numel()));
  be_.fill(lse_.f32(), -std::numeric_limits<float>::infinity(), static_cast<size_t>(lse_.numel()));
  const Tensor block_out = Tensor::empty(pool_, {rows, C}), block_lse = Tensor::empty(pool_, {lse_.numel()});
  Tensor kv = pack_kv(qkv);
  for (int s = 0; s < cp; ++s) {
    Tensor next;
    std::unique_ptr<CommRequest> sent, received;
    if (s + 1 < cp) {  // the next block travels while this one is attended to
      next = Tensor::empty(pool_, kv.shape());
      sent = cp_.send(kv, (me + 1) % cp, kForwardTag + s, be_.stream());
      received = cp_.recv(next, (me + cp - 1) % cp, kForwardTag + s, be_.stream());
    }
    const Tensor& kpos = positions_[static_cast<size_t>((me + cp - s) % cp)];
    be_.attention_block_forward(block_out.f32(), block_lse.f32(), qkv.f32(), R, kv.f32(), kv.f32() + Ckv, 2 * Ckv,
                                positions_[static_cast<size_t>(me)].i32(), starts(), kpos.i32(), B_, Tl_, Tl_, NH_,
                                NKV_, hs_, pool_);
    be_.attention_merge(out_.f32(), lse_.f32(), block_out.f32(), block_lse.f32(), B_, Tl_, NH_, hs_);
    if (received) {
      finish(*received, *sent, be_.stream(), waited_s_);
      kv = std::move(next);
    }
  }
  be_.copy(out.raw(), out_.raw(), out_.bytes());
}

void RingAttention::backward(const Tensor& qkv, const Tensor& dout, const Tensor& dqkv) {
  if (!out_.defined()) fail("ring attention: backward before forward");
  const int cp = cp_.size(), me = cp_.rank(), R = (NH_ + 2 * NKV_) * hs_, Ckv = NKV_ * hs_;
  const int64_t rows = local_rows();
  const Tensor delta = Tensor::empty(pool_, {lse_.numel()});
  be_.attention_delta(delta.f32(), dout.f32(), out_.f32(), B_, Tl_, NH_, hs_);
  be_.fill(dqkv.f32(), 0.0f, static_cast<size_t>(dqkv.numel()));
  Tensor kv = pack_kv(qkv), dkv, sending;
  std::unique_ptr<CommRequest> grad_sent;
  for (int s = 0; s < cp; ++s) {
    Tensor next, earlier;
    std::unique_ptr<CommRequest> sent, received, grad_received;
    if (s + 1 < cp) {  // the next block travels while this one is worked on
      next = Tensor::empty(pool_, kv.shape());
      sent = cp_.send(kv, (me + 1) % cp, kBackwardTag + s, be_.stream());
      received = cp_.recv(next, (me + cp - 1) % cp, kBackwardTag + s, be_.stream());
    }
    if (s > 0) {  // and this block's gradients from the ranks it visited before
      earlier = Tensor::empty(pool_, kv.shape());
      grad_received = cp_.recv(earlier, (me + cp - 1) % cp, kGradTag + s - 1, be_.stream());
    }
    dkv = Tensor::empty(pool_, kv.shape());
    be_.fill(dkv.f32(), 0.0f, static_cast<size_t>(dkv.numel()));
    const Tensor& kpos = positions_[static_cast<size_t>((me + cp - s) % cp)];
    be_.attention_block_backward(dqkv.f32(), R, dkv.f32(), dkv.f32() + Ckv, 2 * Ckv, dout.f32(), delta.f32(),
                                 lse_.f32(), qkv.f32(), R, kv.f32(), kv.f32() + Ckv, 2 * Ckv,
                                 positions_[static_cast<size_t>(me)].i32(), starts(), kpos.i32(), B_, Tl_, Tl_, NH_,
                                 NKV_, hs_, pool_);
    if (grad_received) {
      wait_for(*grad_received, be_.stream(), waited_s_);
      be_.accumulate(dkv.f32(), earlier.f32(), static_cast<size_t>(dkv.numel()));
    }
    // The gradients go on to the next rank (after the last step, the block's owner) while
    // the next block is worked on.
    if (cp > 1) {
      if (grad_sent) grad_sent->wait();
      sending = dkv;
      grad_sent = cp_.send(sending, (me + 1) % cp, s + 1 < cp ? kGradTag + s : kHomeTag, be_.stream());
    }
    if (received) {
      finish(*received, *sent, be_.stream(), waited_s_);
      kv = std::move(next);
    }
  }
  if (cp > 1) {  // this rank's own keys' and values' gradients, home from the last rank they visited
    dkv = Tensor::empty(pool_, kv.shape());
    auto home = cp_.recv(dkv, (me + cp - 1) % cp, kHomeTag, be_.stream());
    wait_for(*home, be_.stream(), waited_s_);
    grad_sent->wait();
  }
  for (int64_t r = 0; r < rows; ++r)
    be_.copy(dqkv.f32() + r * R + NH_ * hs_, dkv.f32() + r * 2 * Ckv, static_cast<size_t>(2 * Ckv) * sizeof(float));
}

}  // namespace pipetrain
