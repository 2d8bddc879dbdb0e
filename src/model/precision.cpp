// working_f32(), store(), compute_weight() and the stored-qkv attention calls of pipetrain/model/precision.hpp.
#include "pipetrain/model/precision.hpp"

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/model/ring_attention.hpp"

namespace pipetrain::layer_util {
namespace {

// Context parallelism's attention stash: the ring, holding its merged output and log-sum-exp.
struct RingStash final : AttentionStash {
  RingStash(const MicrobatchContext& ctx, int C, int NH, int NKV)
      : ring(*ctx.cp, *ctx.backend, *ctx.pool, ctx.B, ctx.cp_tokens, NH, NKV, C / NH, ctx.document_starts) {}
  RingAttention ring;
  size_t bytes() const override { return ring.kept_bytes(); }
};

}  // namespace

std::unique_ptr<AttentionStash> attend(const MicrobatchContext& ctx, const Tensor& out, const Tensor& qkv, int C,
                                       int NH, int NKV) {
  if (!uses_ring(ctx))
    return ctx.backend->attention_forward(out.f32(), qkv.f32(), ctx.B, ctx.T, C, NH, NKV, *ctx.pool, ctx.storage,
                                          ctx.document_positions());
  auto s = std::make_unique<RingStash>(ctx, C, NH, NKV);
  s->ring.forward(qkv, out);
  return s;
}

Tensor working_f32(const MicrobatchContext& ctx, const Tensor& t) {
  if (!t.defined() || t.dtype() == DType::F32) return t;
  check_dtype("working_f32", "the tensor", t, DType::BF16);
  Tensor out = Tensor::empty(*ctx.pool, t.shape());
  ctx.backend->cast_to_f32(out.f32(), t.bf16_data(), static_cast<size_t>(t.numel()));
  return out;
}

Tensor store(const MicrobatchContext& ctx, const Tensor& x) {
  check_dtype("store", "the result", x, DType::F32);
  if (ctx.storage == DType::F32) return x;
  Tensor out = Tensor::empty(*ctx.pool, x.shape(), DType::BF16);
  const auto n = static_cast<size_t>(x.numel());
  ctx.backend->round_to_bf16(out.bf16_data(), x.f32(), n);
  return out;
}

std::unique_ptr<AttentionStash> attention_forward_stored(const MicrobatchContext& ctx, const Tensor& out,
                                                         const Tensor& qkv, int C, int NH, int NKV) {
  Backend& be = *ctx.backend;
  if (uses_ring(ctx)) return attend(ctx, out, working_f32(ctx, qkv), C, NH, NKV);
  if (qkv.dtype() == DType::BF16)
    return be.attention_forward(out.f32(), qkv.bf16_data(), ctx.B, ctx.T, C, NH, NKV, *ctx.pool, ctx.storage,
                                ctx.document_positions());
  return be.attention_forward(out.f32(), qkv.f32(), ctx.B, ctx.T, C, NH, NKV, *ctx.pool, ctx.storage,
                              ctx.document_positions());
}

void attention_backward_stored(const MicrobatchContext& ctx, const Tensor& dqkv, const Tensor& dout,
                               const Tensor& qkv, AttentionStash& stash, int C, int NH, int NKV) {
  Backend& be = *ctx.backend;
  if (uses_ring(ctx)) return static_cast<RingStash&>(stash).ring.backward(working_f32(ctx, qkv), dout, dqkv);
  if (qkv.dtype() == DType::BF16)
    be.attention_backward(dqkv.f32(), dout.f32(), qkv.bf16_data(), stash, ctx.B, ctx.T, C, NH, NKV, *ctx.pool,
                          ctx.document_positions());
  else
    be.attention_backward(dqkv.f32(), dout.f32(), qkv.f32(), stash, ctx.B, ctx.T, C, NH, NKV, *ctx.pool,
                          ctx.document_positions());
}

const Tensor& compute_weight(const Parameter& p) {
  if (p.compute.defined()) return p.compute;
  if (p.compute_bf16.defined())
    fail("parameter {} has no f32 copy of its bf16 values: a kernel that reads a matrix under bf16 reads its bf16 "
         "copy (compute_bf16)",
         p.name);
  return p.value;
}

}  // namespace pipetrain::layer_util
