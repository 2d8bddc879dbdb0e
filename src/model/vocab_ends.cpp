// Positions and FinalNorm (pipetrain/model/vocab_ends.hpp).
#include "pipetrain/model/vocab_ends.hpp"

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/model/precision.hpp"
#include "pipetrain/model/stage.hpp"

namespace pipetrain {

using namespace layer_util;

namespace {
struct PositionsStash : Stash {
  Tensor dy;
};
struct NormStash : Stash {
  Tensor x, mean, rstd, dy;
};
}  // namespace

Positions::Positions(const ModelConfig& cfg, ParameterStore& params)
    : C_(cfg.d_model), wpe_(params.declare("wpe", {cfg.max_seq_len, cfg.d_model}, Init::Normal, 0.02)) {}

Tensor Positions::forward(const MicrobatchContext& ctx, const Tensor& x, std::unique_ptr<Stash>& stash) {
  const Tensor out = Tensor::empty(*ctx.pool, {static_cast<int64_t>(ctx.B) * ctx.T, C_});
  ctx.backend->copy(out.raw(), working_f32(ctx, x).raw(), out.bytes());
  if (wpe_.compute_bf16.defined())
    ctx.backend->position_add(out.f32(), wpe_.compute_bf16.bf16_data(), ctx.B, ctx.T, C_, ctx.document_positions());
  else
    ctx.backend->position_add(out.f32(), wpe_.value.f32(), ctx.B, ctx.T, C_, ctx.document_positions());
  stash = std::make_unique<PositionsStash>();
  return store(ctx, out);
}

Tensor Positions::backward_input(const MicrobatchContext&, const Tensor& dy, Stash& stash) {
  as<PositionsStash>(stash).dy = dy;
  return dy;
}

void Positions::backward_weight(const MicrobatchContext& ctx, Stash& stash) {
  const Tensor dy = working_f32(ctx, as<PositionsStash>(stash).dy);
  ctx.backend->position_backward(wpe_.grad.f32(), dy.f32(), ctx.B, ctx.T, C_, ctx.document_positions());
}

FinalNorm::FinalNorm(const ModelConfig& cfg, ParameterStore& params)
    : C_(cfg.d_model),
      rms_(cfg.family().rms_norm),
      eps_(rms_ ? static_cast<float>(cfg.norm_eps) : kLayerNormEps),
      w_(params.declare(rms_ ? "norm.w" : "lnf.w", {C_}, Init::Ones)),
      b_(rms_ ? nullptr : &params.declare("lnf.b", {C_}, Init::Zeros)) {}

Tensor FinalNorm::forward(const MicrobatchContext& ctx, const Tensor& x, std::unique_ptr<Stash>& stash) {
  Backend& be = *ctx.backend;
  const int N = ctx.B * ctx.T;
  auto s = std::make_unique<NormStash>();
  s->x = x;
  const Tensor xf = working_f32(ctx, x), out = Tensor::empty(*ctx.pool, {N, C_});
  s->rstd = Tensor::empty(*ctx.pool, {N});
  if (rms_) {
    be.rmsnorm_forward(out.f32(), s->rstd.f32(), xf.f32(), compute_weight(w_).f32(), N, C_, eps_);
  } else {
    s->mean = Tensor::empty(*ctx.pool, {N});
    be.layernorm_forward(out.f32(), s->mean.f32(), s->rstd.f32(), xf.f32(), compute_weight(w_).f32(),
                         compute_weight(*b_).f32(), N, C_, eps_);
  }
  stash = std::move(s);
  return store(ctx, out);
}

Tensor FinalNorm::backward_input(const MicrobatchContext& ctx, const Tensor& dy, Stash& stash) {
  Backend& be = *ctx.backend;
  auto& s = as<NormStash>(stash);
  const int N = ctx.B * ctx.T;
  s.dy = dy;
  const Tensor dyf = working_f32(ctx, dy), dx = Tensor::empty(*ctx.pool, {N, C_});
  be.fill(dx.f32(), 0.0f, static_cast<size_t>(N) * C_);
  const Tensor xf = working_f32(ctx, s.x);
  if (rms_)
    be.rmsnorm_backward_input(dx.f32(), dyf.f32(), xf.f32(), compute_weight(w_).f32(), s.rstd.f32(), N, C_);
  else
    be.layernorm_backward_input(dx.f32(), dyf.f32(), xf.f32(), compute_weight(w_).f32(), s.mean.f32(), s.rstd.f32(), N,
                                C_);
  return store(ctx, dx);
}

void FinalNorm::backward_weight(const MicrobatchContext& ctx, Stash& stash) {
  Backend& be = *ctx.backend;
  auto& s = as<NormStash>(stash);
  const int N = ctx.B * ctx.T;
  const Tensor dyf = working_f32(ctx, s.dy), xf = working_f32(ctx, s.x);
  if (rms_)
    be.rmsnorm_backward_weight(w_.grad.f32(), dyf.f32(), xf.f32(), s.rstd.f32(), N, C_);
  else
    be.layernorm_backward_weight(w_.grad.f32(), b_->grad.f32(), dyf.f32(), xf.f32(), s.mean.f32(), s.rstd.f32(), N, C_);
}

}  // namespace pipetrain
