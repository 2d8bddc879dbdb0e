// Final LayerNorm, LM head tied to the token embedding, and cross-entropy over the
// padded vocabulary. The logits buffer is turned into dlogits in the same pass that
// computes the loss (llm.c's fused classifier), so no second N x Vp buffer exists.
#include "pipetrain/backend/backend.hpp"
#include "pipetrain/model/gpt2_layers.hpp"

namespace pipetrain {

using namespace layer_util;

namespace {
struct HeadStash : Stash {
  Tensor x, lnf, mean, rstd, dlogits, dlnf;
};
}  // namespace

LossHead::LossHead(const ModelConfig& cfg, ParameterStore& p)
    : C_(cfg.d_model),
      V_(cfg.vocab_size),
      Vp_(cfg.padded_vocab()),
      lnfw_(p.declare("lnf.w", {C_}, Init::Ones)),
      lnfb_(p.declare("lnf.b", {C_}, Init::Zeros)),
      wte_(declare_wte(cfg, p)) {}

Tensor LossHead::forward(const MicrobatchContext& ctx, const Tensor& x, std::unique_ptr<Stash>& out) {
  Backend& be = *ctx.backend;
  MemoryPool& pool = *ctx.pool;
  const int N = ctx.B * ctx.T, C = C_;
  auto s = std::make_unique<HeadStash>();
  s->x = x;
  s->lnf = Tensor::empty(pool, {N, C});
  s->mean = Tensor::empty(pool, {N});
  s->rstd = Tensor::empty(pool, {N});
  be.layernorm_forward(s->lnf.f32(), s->mean.f32(), s->rstd.f32(), x.f32(), lnfw_.value.f32(),
                       lnfb_.value.f32(), N, C, kLayerNormEps);
  s->dlogits = Tensor::empty(pool, {N, Vp_});
  linear_forward(be, s->dlogits.f32(), s->lnf.f32(), wte_, nullptr, N);
  Tensor losses = Tensor::empty(pool, {N});
  be.crossentropy_forward(losses.f32(), s->dlogits.f32(), ctx.targets.i32(), N, V_, Vp_,
                          ctx.loss_scale);
  out = std::move(s);
  return losses;
}

Tensor LossHead::backward_input(const MicrobatchContext& ctx, const Tensor&, Stash& stash) {
  Backend& be = *ctx.backend;
  auto& s = as<HeadStash>(stash);
  const int N = ctx.B * ctx.T, C = C_;
  s.dlnf = Tensor::empty(*ctx.pool, {N, C});
  linear_backward_input(be, s.dlnf.f32(), s.dlogits.f32(), wte_, N);
  Tensor dx = Tensor::empty(*ctx.pool, {N, C});
  be.fill(dx.f32(), 0.0f, static_cast<size_t>(N) * C);
  be.layernorm_backward_input(dx.f32(), s.dlnf.f32(), s.x.f32(), lnfw_.value.f32(), s.mean.f32(),
                              s.rstd.f32(), N, C);
  return dx;
}

void LossHead::backward_weight(const MicrobatchContext& ctx, Stash& stash) {
  Backend& be = *ctx.backend;
  auto& s = as<HeadStash>(stash);
  const int N = ctx.B * ctx.T;
  linear_backward_weight(be, s.dlogits.f32(), s.lnf.f32(), wte_, nullptr, N);
  be.layernorm_backward_weight(lnfw_.grad.f32(), lnfb_.grad.f32(), s.dlnf.f32(), s.x.f32(),
                               s.mean.f32(), s.rstd.f32(), N, C_);
}

}  // namespace pipetrain
