// Mixed precision on the layers' side. Activations, activation gradients and the stash are
// stored in ctx.storage (f32, or bf16 with train.precision = "bf16"); kernels run on f32
// working copies, and so do the dense products where the backend has no native bf16
// products (a CPU without bf16 instructions: bf16 is a storage precision there, and a
// product's inputs are the rounded values a bf16 product would see). Parameter
// gradients, reductions and the loss stay f32.
#pragma once
#include "pipetrain/model/layer.hpp"

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

}  // namespace pipetrain::layer_util
