// The dense-layer products and the tensor-parallel sum of pipetrain/model/linear.hpp.
#include "pipetrain/backend/backend.hpp"
#include "pipetrain/comm/communicator.hpp"
#include "pipetrain/model/linear.hpp"
#include "pipetrain/model/precision.hpp"

namespace pipetrain::layer_util {

void tp_allreduce(const MicrobatchContext& ctx, const Tensor& x) {
  if (ctx.tp && ctx.tp->size() > 1) ctx.tp->allreduce_sum(x, ctx.backend->stream())->wait();
}

void linear_forward(Backend& be, float* y, const float* x, const Parameter& w, const Parameter* b,
                    int N) {
  const int out = static_cast<int>(w.shape[0]), in = static_cast<int>(w.shape[1]);
  be.gemm(false, true, N, out, in, 1.0f, x, in, compute_weight(w).f32(), in, 0.0f, y, out);
  if (b) be.bias_add(y, compute_weight(*b).f32(), N, out);
}

void linear_backward_input(Backend& be, float* dx, const float* dy, const Parameter& w, int N) {
  const int out = static_cast<int>(w.shape[0]), in = static_cast<int>(w.shape[1]);
  be.gemm(false, false, N, in, out, 1.0f, dy, out, compute_weight(w).f32(), in, 0.0f, dx, in);
}

void linear_backward_weight(Backend& be, const float* dy, const float* x, Parameter& w,
                            Parameter* b, int N) {
  const int out = static_cast<int>(w.shape[0]), in = static_cast<int>(w.shape[1]);
  be.gemm(true, false, out, in, N, 1.0f, dy, out, x, in, 1.0f, w.grad.f32(), in);
  if (b) be.bias_backward(b->grad.f32(), dy, N, out);
}

}  // namespace pipetrain::layer_util
