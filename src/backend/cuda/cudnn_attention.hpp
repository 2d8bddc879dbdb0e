// Causal, grouped-query attention on cuDNN 9's graph API (the cudnnBackend* C functions,
// opened by cudnn_loader), for the CUDA backend's bf16-qkv attention: the forward and
// backward graphs of docs/gpu-cudnn-attention.md, bf16 Q, K, V, O, dO, dQ, dK and dV with f32
// scores, softmax and log-sum-exp. Exports CudnnAttentionStash (what a cuDNN forward keeps)
// and CudnnAttention (an execution plan per shape and pass, built once and cached; the runs).
//
// Backend::attention_forward/backward take and give f32 out, dout and dqkv: the bf16 O, dO and
// dqkv around cuDNN are converted with the cast kernels. A shape cuDNN refuses (or one it is
// not asked for) returns null from forward, and the flash kernels run it; a backward cuDNN
// refuses runs on the flash kernels from the stash (its log-sum-exp is theirs).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/core/memory_pool.hpp"
#include "pipetrain/core/tensor.hpp"

namespace pipetrain::cuda {

struct Ctx;  // cuda_kernels.hpp

// What a cuDNN forward keeps for its backward (its type is the flag that cuDNN made it): the
// output O in bf16, (B, T, C), and each row's natural log-sum-exp of its scaled, masked
// scores, (B, NH, T) f32 — the flash kernels' lse.
class CudnnAttentionStash final : public AttentionStash {
 public:
  Tensor out, stats;
  size_t bytes() const override;
};

// One per CUDA backend, used from one thread at a time (as the backend is), on its device.
class CudnnAttention {
 public:
  CudnnAttention();  // on unless PIPETRAIN_CUDNN_ATTENTION=0 (the flash kernels' second opinion)
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // out (B, T, C) f32 from the bf16 qkv (rows of C + 2 NKV hs), and the stash; null (nothing
  // ran) when cuDNN is off, the shape does not qualify (head size a multiple of 8 up to 128,
  // a 16-byte aligned qkv) or cuDNN refuses it. Heads are checked by the caller.
  std::unique_ptr<AttentionStash> forward(const Ctx& ctx, float* out, const uint16_t* qkv, int B, int T, int C, int NH,
                                          int NKV, MemoryPool& pool);
  // dqkv (overwritten, f32) from dout and the same qkv; on the flash kernels where cuDNN
  // refuses the backward of a shape whose forward it ran.
  void backward(const Ctx& ctx, float* dqkv, const float* dout, const uint16_t* qkv, const CudnnAttentionStash& stash,
                int B, int T, int C, int NH, int NKV, MemoryPool& pool);
  // Drops the plans and the cuDNN handle (the backend calls it before its stream goes).
  void release() noexcept;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace pipetrain::cuda
