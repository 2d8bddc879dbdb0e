// Final LayerNorm, LM head tied to the token embedding, and cross-entropy over the
// padded vocabulary. The logits buffer is turned into dlogits in the same pass that
// computes the loss (llm.c's fused classifier), so no second N x Vp buffer exists.
// With tensor parallelism each rank holds a slice of the vocabulary's logits; the
// row max and the sums of exponentials are all-reduced, the logits never gathered.
#include "pipetrain/backend/backend.hpp"
#include "pipetrain/comm/communicator.hpp"
#include "pipetrain/model/loss_head.hpp"
#include "pipetrain/model/embedding.hpp"
#include "pipetrain/model/stage.hpp"
#include "pipetrain/model/linear.hpp"
#include "pipetrain/model/precision.hpp"

namespace pipetrain {

using namespace layer_util;

namespace {
struct HeadStash : Stash {
  Tensor x, lnf, mean, rstd, dlogits, dlnf;
};
}  // namespace

LossHead::LossHead(const ModelConfig& cfg, ParameterStore& p, TensorParallel tp)
    : C_(cfg.d_model),
      V_(cfg.vocab_size),
      Vl_(cfg.padded_vocab() / tp.size),
      col_begin_(cfg.padded_vocab() / tp.size * tp.rank),
      rms_(cfg.family().rms_norm),
      eps_(rms_ ? static_cast<float>(cfg.norm_eps) : kLayerNormEps),
      lnfw_(p.declare(rms_ ? "norm.w" : "lnf.w", {C_}, Init::Ones)),
      lnfb_(rms_ ? nullptr : &p.declare("lnf.b", {C_}, Init::Zeros)),
      wte_(cfg.tied() ? declare_wte(cfg, p, tp) : declare_lm_head(cfg, p, tp)) {}

namespace {
// Cross-entropy over vocabulary-parallel logits (N x Vl on each rank).
void parallel_crossentropy(const MicrobatchContext& ctx, float* losses, float* logits, int N, int Vl,
                           int col_begin, int V) {
  Backend& be = *ctx.backend;
  Tensor stats = Tensor::empty(*ctx.pool, {3, N});  // row max, sum of exp, target logit
  float* rowmax = stats.f32();
  float* sums = rowmax + N;
  be.crossentropy_local_max(rowmax, logits, N, Vl, col_begin, V);
  ctx.tp->allreduce_max(stats.view(0, {N}), be.stream())->wait_on(be.stream());
  be.crossentropy_local_sums(sums, sums + N, logits, rowmax, ctx.targets.i32(), N, Vl, col_begin, V);
  ctx.tp->allreduce_sum(stats.view(N, {2, N}), be.stream())->wait_on(be.stream());
  be.crossentropy_finish(losses, logits, rowmax, sums, sums + N, ctx.targets.i32(), N, Vl, col_begin, V,
                         ctx.loss_scale);
}
}  // namespace

Tensor LossHead::forward(const MicrobatchContext& ctx, const Tensor& x, std::unique_ptr<Stash>& out) {
  Backend& be = *ctx.backend;
  MemoryPool& pool = *ctx.pool;
  const int N = ctx.B * ctx.T, C = C_;
  auto s = std::make_unique<HeadStash>();
  const Tensor xf = working_f32(ctx, x);
  s->x = x;
  const Tensor lnf = Tensor::empty(pool, {N, C});
  s->rstd = Tensor::empty(pool, {N});
  if (rms_) {
    be.rmsnorm_forward(lnf.f32(), s->rstd.f32(), xf.f32(), compute_weight(lnfw_).f32(), N, C, eps_);
  } else {
    s->mean = Tensor::empty(pool, {N});
    be.layernorm_forward(lnf.f32(), s->mean.f32(), s->rstd.f32(), xf.f32(), compute_weight(lnfw_).f32(),
                         compute_weight(*lnfb_).f32(), N, C, eps_);
  }
  s->lnf = store(ctx, lnf);
  // Logits and the loss in f32; the logits' gradient is kept in the stored form.
  const Tensor dlogits = Tensor::empty(pool, {N, Vl_});
  linear_forward(ctx, dlogits, s->lnf, wte_, nullptr);
  if (ctx.logits) {  // generation: the logits themselves
    out = std::move(s);
    return dlogits;
  }
  Tensor losses = Tensor::empty(pool, {N});
  if (ctx.tp && ctx.tp->size() > 1)
    parallel_crossentropy(ctx, losses.f32(), dlogits.f32(), N, Vl_, col_begin_, V_);
  else
    be.crossentropy_forward(losses.f32(), dlogits.f32(), ctx.targets.i32(), N, V_, Vl_, ctx.loss_scale);
  if (ctx.loss_scale != 0) s->dlogits = store(ctx, dlogits);  // evaluation keeps no gradient
  out = std::move(s);
  return losses;
}

Tensor LossHead::backward_input(const MicrobatchContext& ctx, const Tensor&, Stash& stash) {
  Backend& be = *ctx.backend;
  auto& s = as<HeadStash>(stash);
  const int N = ctx.B * ctx.T, C = C_;
  const Tensor dlnf = Tensor::empty(*ctx.pool, {N, C});
  linear_backward_input(ctx, dlnf, s.dlogits, wte_);
  layer_util::tp_allreduce(ctx, dlnf);
  s.dlnf = store(ctx, dlnf);
  const Tensor dx = Tensor::empty(*ctx.pool, {N, C});
  be.fill(dx.f32(), 0.0f, static_cast<size_t>(N) * C);
  if (rms_)
    be.rmsnorm_backward_input(dx.f32(), dlnf.f32(), working_f32(ctx, s.x).f32(), compute_weight(lnfw_).f32(),
                              s.rstd.f32(), N, C);
  else
    be.layernorm_backward_input(dx.f32(), dlnf.f32(), working_f32(ctx, s.x).f32(), compute_weight(lnfw_).f32(),
                                s.mean.f32(), s.rstd.f32(), N, C);
  return store(ctx, dx);
}

void LossHead::backward_weight(const MicrobatchContext& ctx, Stash& stash) {
  Backend& be = *ctx.backend;
  auto& s = as<HeadStash>(stash);
  const int N = ctx.B * ctx.T;
  auto f = [&](const Tensor& t) { return working_f32(ctx, t); };
  linear_backward_weight(ctx, s.dlogits, s.lnf, wte_, nullptr);
  if (rms_)
    be.rmsnorm_backward_weight(lnfw_.grad.f32(), f(s.dlnf).f32(), f(s.x).f32(), s.rstd.f32(), N, C_);
  else
    be.layernorm_backward_weight(lnfw_.grad.f32(), lnfb_->grad.f32(), f(s.dlnf).f32(), f(s.x).f32(), s.mean.f32(),
                                 s.rstd.f32(), N, C_);
}

}  // namespace pipetrain
