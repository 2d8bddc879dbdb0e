// GPT-2 transformer block (pre-LayerNorm):
//   y = r + MLP(LN2(r)),  r = x + Proj(Attn(QKV(LN1(x))))
#include <cmath>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/model/gpt2_layers.hpp"

namespace pipetrain {

using namespace layer_util;

namespace {
struct BlockStash : Stash {
  // forward
  Tensor x, ln1, mean1, rstd1, qkv, att, atty, res2, ln2, mean2, rstd2, fch, fch_gelu;
  // backward_input, kept for backward_weight
  Tensor dy, dfch, dln2, dres2, dqkv, dln1;
};
std::string key(int layer, const char* leaf) { return "h." + std::to_string(layer) + "." + leaf; }
}  // namespace

Block::Block(const ModelConfig& cfg, int index, ParameterStore& p)
    : index_(index),
      C_(cfg.d_model),
      NH_(cfg.n_head),
      ln1w_(p.declare(key(index, "ln1.w"), {C_}, Init::Ones)),
      ln1b_(p.declare(key(index, "ln1.b"), {C_}, Init::Zeros)),
      qkvw_(p.declare(key(index, "attn.qkv.w"), {3 * C_, C_}, Init::Normal, 0.02)),
      qkvb_(p.declare(key(index, "attn.qkv.b"), {3 * C_}, Init::Zeros)),
      projw_(p.declare(key(index, "attn.proj.w"), {C_, C_}, Init::Normal,
                       0.02 / std::sqrt(2.0 * cfg.n_layer))),
      projb_(p.declare(key(index, "attn.proj.b"), {C_}, Init::Zeros)),
      ln2w_(p.declare(key(index, "ln2.w"), {C_}, Init::Ones)),
      ln2b_(p.declare(key(index, "ln2.b"), {C_}, Init::Zeros)),
      fcw_(p.declare(key(index, "mlp.fc.w"), {4 * C_, C_}, Init::Normal, 0.02)),
      fcb_(p.declare(key(index, "mlp.fc.b"), {4 * C_}, Init::Zeros)),
      fcprojw_(p.declare(key(index, "mlp.proj.w"), {C_, 4 * C_}, Init::Normal,
                         0.02 / std::sqrt(2.0 * cfg.n_layer))),
      fcprojb_(p.declare(key(index, "mlp.proj.b"), {C_}, Init::Zeros)) {}

Tensor Block::forward(const MicrobatchContext& ctx, const Tensor& x, std::unique_ptr<Stash>& out) {
  Backend& be = *ctx.backend;
  MemoryPool& pool = *ctx.pool;
  const int B = ctx.B, T = ctx.T, N = B * T, C = C_;
  auto s = std::make_unique<BlockStash>();
  s->x = x;
  s->ln1 = Tensor::empty(pool, {N, C});
  s->mean1 = Tensor::empty(pool, {N});
  s->rstd1 = Tensor::empty(pool, {N});
  be.layernorm_forward(s->ln1.f32(), s->mean1.f32(), s->rstd1.f32(), x.f32(), ln1w_.value.f32(),
                       ln1b_.value.f32(), N, C, kLayerNormEps);
  s->qkv = Tensor::empty(pool, {N, 3 * C});
  linear_forward(be, s->qkv.f32(), s->ln1.f32(), qkvw_, &qkvb_, N);
  s->att = Tensor::empty(pool, {B, NH_, T, T});
  s->atty = Tensor::empty(pool, {N, C});
  be.attention_forward(s->atty.f32(), s->att.f32(), s->qkv.f32(), B, T, C, NH_);
  s->res2 = Tensor::empty(pool, {N, C});
  linear_forward(be, s->res2.f32(), s->atty.f32(), projw_, &projb_, N);
  be.accumulate(s->res2.f32(), x.f32(), static_cast<size_t>(N) * C);
  s->ln2 = Tensor::empty(pool, {N, C});
  s->mean2 = Tensor::empty(pool, {N});
  s->rstd2 = Tensor::empty(pool, {N});
  be.layernorm_forward(s->ln2.f32(), s->mean2.f32(), s->rstd2.f32(), s->res2.f32(),
                       ln2w_.value.f32(), ln2b_.value.f32(), N, C, kLayerNormEps);
  s->fch = Tensor::empty(pool, {N, 4 * C});
  linear_forward(be, s->fch.f32(), s->ln2.f32(), fcw_, &fcb_, N);
  s->fch_gelu = Tensor::empty(pool, {N, 4 * C});
  be.gelu_forward(s->fch_gelu.f32(), s->fch.f32(), static_cast<size_t>(N) * 4 * C);
  Tensor y = Tensor::empty(pool, {N, C});
  linear_forward(be, y.f32(), s->fch_gelu.f32(), fcprojw_, &fcprojb_, N);
  be.accumulate(y.f32(), s->res2.f32(), static_cast<size_t>(N) * C);
  out = std::move(s);
  return y;
}

Tensor Block::backward_input(const MicrobatchContext& ctx, const Tensor& dy, Stash& stash) {
  Backend& be = *ctx.backend;
  MemoryPool& pool = *ctx.pool;
  auto& s = as<BlockStash>(stash);
  const int B = ctx.B, T = ctx.T, N = B * T, C = C_;
  const size_t NC = static_cast<size_t>(N) * C;
  s.dy = dy;
  // MLP branch: dy -> d(fch_gelu) -> d(fch) -> d(ln2) -> d(res2) += ...
  s.dfch = Tensor::empty(pool, {N, 4 * C});
  linear_backward_input(be, s.dfch.f32(), dy.f32(), fcprojw_, N);
  be.gelu_backward(s.dfch.f32(), s.fch.f32(), s.dfch.f32(), NC * 4);
  s.dln2 = Tensor::empty(pool, {N, C});
  linear_backward_input(be, s.dln2.f32(), s.dfch.f32(), fcw_, N);
  s.dres2 = Tensor::empty(pool, {N, C});
  be.copy(s.dres2.f32(), dy.f32(), NC * sizeof(float));
  be.layernorm_backward_input(s.dres2.f32(), s.dln2.f32(), s.res2.f32(), ln2w_.value.f32(),
                              s.mean2.f32(), s.rstd2.f32(), N, C);
  // Attention branch: d(res2) -> d(atty) -> d(qkv) -> d(ln1) -> dx += ...
  Tensor datty = Tensor::empty(pool, {N, C});
  linear_backward_input(be, datty.f32(), s.dres2.f32(), projw_, N);
  s.dqkv = Tensor::empty(pool, {N, 3 * C});
  {
    Tensor scratch = Tensor::empty(pool, {B, NH_, T, T});
    be.attention_backward(s.dqkv.f32(), scratch.f32(), datty.f32(), s.qkv.f32(), s.att.f32(), B, T,
                          C, NH_);
  }
  s.dln1 = std::move(datty);  // same shape; datty is no longer needed
  linear_backward_input(be, s.dln1.f32(), s.dqkv.f32(), qkvw_, N);
  Tensor dx = Tensor::empty(pool, {N, C});
  be.copy(dx.f32(), s.dres2.f32(), NC * sizeof(float));
  be.layernorm_backward_input(dx.f32(), s.dln1.f32(), s.x.f32(), ln1w_.value.f32(), s.mean1.f32(),
                              s.rstd1.f32(), N, C);
  // Activations only the input gradient needed can go now.
  s.att = {};
  s.fch = {};
  return dx;
}

void Block::backward_weight(const MicrobatchContext& ctx, Stash& stash) {
  Backend& be = *ctx.backend;
  auto& s = as<BlockStash>(stash);
  const int N = ctx.B * ctx.T, C = C_;
  linear_backward_weight(be, s.dy.f32(), s.fch_gelu.f32(), fcprojw_, &fcprojb_, N);
  linear_backward_weight(be, s.dfch.f32(), s.ln2.f32(), fcw_, &fcb_, N);
  be.layernorm_backward_weight(ln2w_.grad.f32(), ln2b_.grad.f32(), s.dln2.f32(), s.res2.f32(),
                               s.mean2.f32(), s.rstd2.f32(), N, C);
  linear_backward_weight(be, s.dres2.f32(), s.atty.f32(), projw_, &projb_, N);
  linear_backward_weight(be, s.dqkv.f32(), s.ln1.f32(), qkvw_, &qkvb_, N);
  be.layernorm_backward_weight(ln1w_.grad.f32(), ln1b_.grad.f32(), s.dln1.f32(), s.x.f32(),
                               s.mean1.f32(), s.rstd1.f32(), N, C);
}

}  // namespace pipetrain
