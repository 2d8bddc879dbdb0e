// Ring attention, the attention of context parallelism (Transformer Engine's
// AttnFuncWithCPAndKVP2P, Liu et al.'s ring attention): a sequence of T tokens is cut into
// 2 cp chunks and rank i of the cp ranks holds chunks i and 2cp-1-i, so every rank has
// the same causal work. Each rank's keys and values travel around the ring: at step s a
// rank attends its queries to the block that started at rank i - s (Backend's
// attention_block_forward, by global positions) while it passes that block on with
// nonblocking transfers and receives the next, and merges the blocks' partial outputs by
// their log-sum-exp. The backward walks the ring the same way, each block's key and value
// gradients travelling one step behind it (received while the block is worked on, passed on
// while the next one is) and reaching their owner after the last step; it recomputes
// each block's probabilities from the merged log-sum-exp, so nothing of T x T is kept.
//
// One object per attention call: forward keeps the merged output and log-sum-exp (B Tl x
// NH hs and B NH Tl floats) for backward. The ring runs over whatever communicator it is
// given: in training DeviceComms::cp (the Grid's cp_comm; on GPUs staged through host
// buffers), through precision's attend().
#pragma once
#include <cstdint>
#include <vector>

#include "pipetrain/core/tensor.hpp"
#include "pipetrain/model/layer.hpp"

namespace pipetrain {

class Backend;
class Communicator;

// The global positions of rank `rank`'s rows of one sequence of T tokens over cp ranks:
// chunk rank, then chunk 2 cp - 1 - rank, of T / (2 cp) tokens each.
std::vector<int32_t> ring_positions(int T, int cp, int rank);

// Whether a microbatch's attention is the ring (MicrobatchContext::cp with more than one rank).
bool uses_ring(const MicrobatchContext& ctx);

class RingAttention {
 public:
  // B sequences of T tokens over the ranks of `cp` (2 cp must divide T); NH query and NKV
  // key/value heads of hs channels. document_starts (this rank's B x T / cp rows, int32 on
  // the device; undefined: none): under packed documents, the global position of each
  // token's document's first token, before which it sees no key.
  RingAttention(Communicator& cp, Backend& backend, MemoryPool& pool, int B, int T, int NH, int NKV, int hs,
                Tensor document_starts = {});
  int local_rows() const { return B_ * Tl_; }  // this rank's rows: B x T / cp
  // qkv: this rank's rows of [Q | K | V] (rows of (NH + 2 NKV) hs); out: (B Tl, NH hs).
  void forward(const Tensor& qkv, const Tensor& out);
  // dqkv (overwritten, like qkv) from dout, for the qkv of the last forward.
  void backward(const Tensor& qkv, const Tensor& dout, const Tensor& dqkv);
  size_t kept_bytes() const { return out_.bytes() + lse_.bytes(); }  // from forward to backward
  // Seconds this object's passes waited for the ring's transfers after computing (exposed).
  double waited_seconds() const { return waited_s_; }

 private:
  Tensor pack_kv(const Tensor& qkv) const;  // the K and V columns of qkv's rows, contiguous
  Tensor positions_of(int rank) const;      // ring_positions for every sequence, on the device
  Communicator& cp_;
  Backend& be_;
  MemoryPool& pool_;
  int B_, T_, Tl_, NH_, NKV_, hs_;
  Tensor out_, lse_;
  std::vector<Tensor> positions_;  // every cp rank's rows' positions (its keys' and, for this rank, queries')
  Tensor starts_;                  // document_starts
  const int32_t* starts() const { return starts_.defined() ? starts_.i32() : nullptr; }
  double waited_s_ = 0;
};

}  // namespace pipetrain
