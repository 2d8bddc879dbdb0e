// The products of a dense layer Y = X W^T + b with W stored (out, in), and the
// tensor-parallel sum, shared by the layer implementations.
#pragma once
#include <cstddef>

#include "pipetrain/model/layer.hpp"

namespace pipetrain::layer_util {

// Sums x over the tensor-parallel ranks (no-op without tensor parallelism).
void tp_allreduce(const MicrobatchContext& ctx, const Tensor& x);
// Y = X W^T (+ b): X (N, in), W (out, in), Y (N, out).
void linear_forward(Backend& be, float* y, const float* x, const Parameter& w, const Parameter* b, int N);
// dX = dY W  (overwrites)
void linear_backward_input(Backend& be, float* dx, const float* dy, const Parameter& w, int N);
// dW += dY^T X; db += colsum(dY)
void linear_backward_weight(Backend& be, const float* dy, const float* x, Parameter& w, Parameter* b, int N);

}  // namespace pipetrain::layer_util
