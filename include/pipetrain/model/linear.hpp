// The products of a dense layer Y = X W^T + b with W stored (out, in), and the
// tensor-parallel sum, shared by the layer implementations. Inputs X and dY come in
// their stored form (precision.hpp): in bf16, with the weights' bf16 copies, on a backend
// that multiplies bf16 itself (Backend::bf16_products_native), the products are bf16
// products with f32 accumulation (Backend::gemm_bf16, bias and GELU in the epilogue);
// otherwise f32 products (a bf16 activation widened first, the weights' f32 copy of their
// rounded values). Outputs and parameter gradients are f32.
#pragma once
#include <cstddef>

#include "pipetrain/model/layer.hpp"

namespace pipetrain::layer_util {

// Whether the layer runs on more than one tensor-parallel rank.
bool tensor_parallel(const MicrobatchContext& ctx);
// Sums x over the tensor-parallel ranks (no-op without tensor parallelism).
void tp_allreduce(const MicrobatchContext& ctx, const Tensor& x);
// Y = X W^T (+ b) (+ residual): X (N, in), W (out, in), Y and the f32 residual (N, out).
void linear_forward(const MicrobatchContext& ctx, const Tensor& y, const Tensor& x, const Parameter& w,
                    const Parameter* b, const Tensor* residual = nullptr);
// Y = gelu(X W^T + b), the pre-activation X W^T + b in `pre` (both (N, out), f32).
void linear_gelu_forward(const MicrobatchContext& ctx, const Tensor& y, const Tensor& pre, const Tensor& x,
                         const Parameter& w, const Parameter& b);
// dX = dY W  (overwrites)
void linear_backward_input(const MicrobatchContext& ctx, const Tensor& dx, const Tensor& dy, const Parameter& w);
// dW += dY^T X; db += colsum(dY)
void linear_backward_weight(const MicrobatchContext& ctx, const Tensor& dy, const Tensor& x, Parameter& w,
                            Parameter* b);

}  // namespace pipetrain::layer_util
