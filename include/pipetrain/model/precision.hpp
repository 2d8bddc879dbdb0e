// Mixed precision on the layers' side. Activations, activation gradients and the stash are
// stored in ctx.storage (f32, or bf16 with train.precision = "bf16"); kernels run on f32
// working copies, and so do the dense products where the backend has no native bf16
// products (a CPU without bf16 instructions: bf16 is a storage precision there, and a
// product's inputs are the rounded values a bf16 product would see). Parameter
// gradients, reductions and the loss stay f32.
#pragma once
#include <memory>

#include "pipetrain/model/layer.hpp"

namespace pipetrain {
class AttentionStash;
}

namespace pipetrain::layer_util {

// `t` itself when it is f32; else a pooled f32 copy of it.
Tensor working_f32(const MicrobatchContext& ctx, const Tensor& t);
// The stored form of an f32 result: `x` itself in f32; in bf16, x is rounded to bf16 in
// place (what follows computes with the stored values) and a pooled bf16 copy returned.
Tensor store(const MicrobatchContext& ctx, const Tensor& x);
// The weights f32 kernels use: the master weights in fp32; under bf16 their rounded values
// widened to f32 (an Error naming the parameter where it has no widened copy: a matrix where
// products are native bf16, see Parameter::compute).
const Tensor& compute_weight(const Parameter& p);
// Attention's forward from the f32 qkv a block's forward computed: the backend's causal
// attention (packed documents' positions where the context has them), or under context
// parallelism the ring (model/ring_attention.hpp), whose stash is the ring itself.
std::unique_ptr<AttentionStash> attend(const MicrobatchContext& ctx, const Tensor& out, const Tensor& qkv, int C,
                                       int NH, int NKV);
// Attention's forward (as recomputation runs it) and backward from qkv as stored: bf16
// qkv is handed over as it is (the backend widens it, or multiplies it as bf16), an f32
// one as f32 (the ring takes f32). C, NH, NKV as Backend::attention_forward.
std::unique_ptr<AttentionStash> attention_forward_stored(const MicrobatchContext& ctx, const Tensor& out,
                                                         const Tensor& qkv, int C, int NH, int NKV);
void attention_backward_stored(const MicrobatchContext& ctx, const Tensor& dqkv, const Tensor& dout,
                               const Tensor& qkv, AttentionStash& stash, int C, int NH, int NKV);

}  // namespace pipetrain::layer_util
