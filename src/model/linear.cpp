// The dense-layer products and the tensor-parallel sum of pipetrain/model/linear.hpp.
#include "pipetrain/backend/backend.hpp"
#include "pipetrain/comm/communicator.hpp"
#include "pipetrain/model/linear.hpp"
#include "pipetrain/model/precision.hpp"

namespace pipetrain::layer_util {

namespace {

// Both operands of a product in bf16 and a backend that multiplies bf16 itself: the bf16
// path. Else f32: a bf16 activation widened once into a working copy, the weights' f32
// copy of their bf16-rounded values (the same operands either way).
bool bf16_product(const MicrobatchContext& ctx, const Tensor& x, const Parameter& w) {
  return x.dtype() == DType::BF16 && w.compute_bf16.defined() && ctx.backend->bf16_products_native();
}
bool bf16_product(const MicrobatchContext& ctx, const Tensor& a, const Tensor& b) {
  return a.dtype() == DType::BF16 && b.dtype() == DType::BF16 && ctx.backend->bf16_products_native();
}

int rows_of(const Tensor& t) { return static_cast<int>(t.numel() / t.dim(t.ndim() - 1)); }

}  // namespace

bool tensor_parallel(const MicrobatchContext& ctx) { return ctx.tp && ctx.tp->size() > 1; }

void tp_allreduce(const MicrobatchContext& ctx, const Tensor& x) {
  // The stream, not the host, waits (on a GPU the sum runs on the communicator's stream).
  if (tensor_parallel(ctx)) ctx.tp->allreduce_sum(x, ctx.backend->stream())->wait_on(ctx.backend->stream());
}

void linear_forward(const MicrobatchContext& ctx, const Tensor& y, const Tensor& x, const Parameter& w,
                    const Parameter* b, const Tensor* residual) {
  Backend& be = *ctx.backend;
  const int out = static_cast<int>(w.shape[0]), in = static_cast<int>(w.shape[1]), N = rows_of(x);
  if (bf16_product(ctx, x, w)) {
    be.gemm_bf16(false, true, N, out, in, 1.0f, x.bf16_data(), in, w.compute_bf16.bf16_data(), in, 0.0f, y.f32(), out,
                 b ? Backend::Epilogue::kBias : Backend::Epilogue::kNone, b ? compute_weight(*b).f32() : nullptr);
    if (residual) be.accumulate(y.f32(), residual->f32(), static_cast<size_t>(y.numel()));
    return;
  }
  const Tensor xf = working_f32(ctx, x);
  be.dense_forward(N, out, in, xf.f32(), compute_weight(w).f32(), y.f32(), b ? compute_weight(*b).f32() : nullptr,
                   residual ? residual->f32() : nullptr);
}

void linear_gelu_forward(const MicrobatchContext& ctx, const Tensor& y, const Tensor& pre, const Tensor& x,
                         const Parameter& w, const Parameter& b) {
  Backend& be = *ctx.backend;
  const int out = static_cast<int>(w.shape[0]), in = static_cast<int>(w.shape[1]), N = rows_of(x);
  if (bf16_product(ctx, x, w)) {
    be.gemm_bf16(false, true, N, out, in, 1.0f, x.bf16_data(), in, w.compute_bf16.bf16_data(), in, 0.0f, y.f32(), out,
                 Backend::Epilogue::kBiasGelu, compute_weight(b).f32(), pre.f32());
    return;
  }
  linear_forward(ctx, pre, x, w, &b);
  be.gelu_forward(y.f32(), pre.f32(), static_cast<size_t>(pre.numel()));
}

void linear_backward_input(const MicrobatchContext& ctx, const Tensor& dx, const Tensor& dy, const Parameter& w) {
  Backend& be = *ctx.backend;
  const int out = static_cast<int>(w.shape[0]), in = static_cast<int>(w.shape[1]), N = rows_of(dy);
  if (bf16_product(ctx, dy, w)) {
    be.gemm_bf16(false, false, N, in, out, 1.0f, dy.bf16_data(), out, w.compute_bf16.bf16_data(), in, 0.0f, dx.f32(),
                 in);
    return;
  }
  const Tensor dyf = working_f32(ctx, dy);
  be.dense_backward_input(N, out, in, dyf.f32(), compute_weight(w).f32(), dx.f32());
}

void linear_backward_weight(const MicrobatchContext& ctx, const Tensor& dy, const Tensor& x, Parameter& w,
                            Parameter* b) {
  Backend& be = *ctx.backend;
  const int out = static_cast<int>(w.shape[0]), in = static_cast<int>(w.shape[1]), N = rows_of(dy);
  if (bf16_product(ctx, dy, x)) {
    be.gemm_bf16(true, false, out, in, N, 1.0f, dy.bf16_data(), out, x.bf16_data(), in, 1.0f, w.grad.f32(), in);
  } else {
    const Tensor dyf = working_f32(ctx, dy), xf = working_f32(ctx, x);
    be.dense_backward_weight(N, out, in, dyf.f32(), xf.f32(), w.grad.f32());
  }
  if (b) be.bias_backward(b->grad.f32(), working_f32(ctx, dy).f32(), N, out);
}

}  // namespace pipetrain::layer_util
