// Llama's block halves (pipetrain/model/llama_block.hpp): forward, the two backward
// halves and selective recomputation of each.
#include "pipetrain/model/llama_block.hpp"

#include <cmath>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/core/grid_rules.hpp"
#include "pipetrain/model/kv_cache.hpp"
#include "pipetrain/model/linear.hpp"
#include "pipetrain/model/moe_mlp.hpp"
#include "pipetrain/model/precision.hpp"
#include "pipetrain/model/sequence_parallel.hpp"

namespace pipetrain {

using namespace layer_util;

namespace {

struct AttentionHalfStash : Stash {
  Tensor x, rstd1, n1, qkv, atty;  // forward
  std::unique_ptr<AttentionStash> att;
  Tensor dy, dqkv, dn1;            // backward_input, kept for backward_weight
};
struct MlpHalfStash : Stash {
  Tensor x, rstd2, n2, g, u, a;  // forward
  Tensor dy, dg, du, dn2;        // backward_input, kept for backward_weight
};

std::string key(int layer, const char* leaf) { return "h." + std::to_string(layer) + "." + leaf; }

// This rank's rows of [Q; K; V]: its query heads and its key/value heads.
Shard qkv_rows(const ModelConfig& cfg, TensorParallel tp) {
  if (tp.size == 1) return {};
  const int64_t hs = cfg.d_model / cfg.n_head, q = cfg.n_head * hs / tp.size, kv = cfg.kv_heads() * hs / tp.size;
  const int64_t Q = int64_t{cfg.n_head} * hs, KV = int64_t{cfg.kv_heads()} * hs;
  return {0, {{tp.rank * q, q}, {Q + tp.rank * kv, kv}, {Q + KV + tp.rank * kv, kv}}};
}

Tensor f32_like(const MicrobatchContext& ctx, int64_t rows, int64_t cols) { return Tensor::empty(*ctx.pool, {rows, cols}); }

// residual + the row-parallel product of `in`'s N rows summed over the tp ranks (this
// rank's rows of it under sequence parallelism; the residual, of as many rows, joins after
// the tp sum, else in the product).
Tensor row_parallel_residual(const MicrobatchContext& ctx, const Tensor& in, const Parameter& w,
                             const Tensor& residual) {
  const bool tp = tensor_parallel(ctx);
  Tensor out = f32_like(ctx, in.shape()[0], w.shape[0]);
  linear_forward(ctx, out, in, w, nullptr, tp ? nullptr : &residual);
  out = finish_row_parallel(ctx, out);
  if (tp) ctx.backend->accumulate(out.f32(), residual.f32(), static_cast<size_t>(out.numel()));
  return out;
}

// The RMSNorm weight's gradient from this rank's rows (summed over tp under sequence parallelism).
void rmsnorm_weight_grad(const MicrobatchContext& ctx, Parameter& w, const Tensor& dn, const Tensor& x,
                         const Tensor& rstd, int n, int C) {
  replicated_grads(ctx, {&w}, [&](const std::vector<float*>& g) {
    ctx.backend->rmsnorm_backward_weight(g[0], working_f32(ctx, dn).f32(), working_f32(ctx, x).f32(), rstd.f32(), n, C);
  });
}

// y = x + norm-branch(x) backward's input half: dx = dy + RMSNorm's input gradient of dn.
Tensor residual_rmsnorm_dx(const MicrobatchContext& ctx, const Tensor& dyf, const Tensor& dn, const Tensor& x,
                           const Parameter& w, const Tensor& rstd, int N, int C) {
  const Tensor dx = f32_like(ctx, N, C);
  ctx.backend->copy(dx.f32(), dyf.f32(), static_cast<size_t>(N) * C * sizeof(float));
  ctx.backend->rmsnorm_backward_input(dx.f32(), dn.f32(), working_f32(ctx, x).f32(), compute_weight(w).f32(),
                                      rstd.f32(), N, C);
  return dx;
}

}  // namespace

std::unique_ptr<Layer> make_llama_mlp(const ModelConfig& cfg, int index, ParameterStore& params, TensorParallel tp,
                                      ExpertParallel ep) {
  if (!cfg.moe(index)) return std::make_unique<LlamaMlp>(cfg, index, params, tp);
  return std::make_unique<MoeMlp>(cfg, index, params, ep, tp);
}

LlamaBlock::LlamaBlock(const ModelConfig& cfg, int index, ParameterStore& params, TensorParallel tp, ExpertParallel ep)
    : BlockPair("llama block " + std::to_string(index), [&] {
        BlockHalves h;
        h.attention = std::make_unique<LlamaAttention>(cfg, index, params, tp);
        h.mlp = make_llama_mlp(cfg, index, params, tp, ep);
        return h;
      }()) {}

LlamaAttention::LlamaAttention(const ModelConfig& cfg, int index, ParameterStore& p, TensorParallel tp)
    : index_(index),
      C_(cfg.d_model),
      hs_(cfg.d_model / cfg.n_head),
      NHl_(cfg.n_head / tp.size),
      NKVl_(cfg.kv_heads() / tp.size),
      eps_(static_cast<float>(cfg.norm_eps)),
      theta_(static_cast<float>(cfg.rope_theta)),
      n1w_(p.declare(key(index, "attn_norm.w"), {C_}, Init::Ones)),
      qkvw_(p.declare_shard(key(index, "attn.qkv.w"), {(cfg.n_head + 2 * cfg.kv_heads()) * int64_t{hs_}, C_},
                            qkv_rows(cfg, tp), Init::Normal, 0.02)),
      ow_(p.declare_shard(key(index, "attn.o.w"), {C_, C_}, tp_slice(1, C_, tp), Init::Normal,
                          0.02 / std::sqrt(2.0 * cfg.n_layer))) {
  if (const std::string e = tp_split_problem(cfg, tp.size); !e.empty()) fail("{}", e);
}

LlamaMlp::LlamaMlp(const ModelConfig& cfg, int index, ParameterStore& p, TensorParallel tp)
    : index_(index),
      C_(cfg.d_model),
      Fl_(cfg.ffn() / tp.size),
      eps_(static_cast<float>(cfg.norm_eps)),
      n2w_(p.declare(key(index, "mlp_norm.w"), {C_}, Init::Ones)),
      gatew_(
          p.declare_shard(key(index, "mlp.gate.w"), {cfg.ffn(), C_}, tp_slice(0, cfg.ffn(), tp), Init::Normal, 0.02)),
      upw_(p.declare_shard(key(index, "mlp.up.w"), {cfg.ffn(), C_}, tp_slice(0, cfg.ffn(), tp), Init::Normal, 0.02)),
      downw_(p.declare_shard(key(index, "mlp.down.w"), {C_, cfg.ffn()}, tp_slice(1, cfg.ffn(), tp), Init::Normal,
                             0.02 / std::sqrt(2.0 * cfg.n_layer))) {}

void LlamaAttention::rotate(const MicrobatchContext& ctx, const Tensor& qkv, bool inverse) const {
  const int ld = (NHl_ + 2 * NKVl_) * hs_;
  const int pos0 = ctx.kv ? ctx.kv->length() : 0;  // generation: the tokens follow the cached ones
  const int32_t* positions = ctx.document_positions();
  ctx.backend->rope(qkv.f32(), ctx.B, ctx.T, ld, NHl_, hs_, theta_, inverse, pos0, positions);
  ctx.backend->rope(qkv.f32() + NHl_ * hs_, ctx.B, ctx.T, ld, NKVl_, hs_, theta_, inverse, pos0, positions);
}

// store() rounds its f32 argument in place, so what follows computes with stored values.
Tensor LlamaAttention::forward(const MicrobatchContext& ctx, const Tensor& x, std::unique_ptr<Stash>& out) {
  Backend& be = *ctx.backend;
  const int N = ctx.B * ctx.T, n = local_rows(ctx), C = C_, Cq = NHl_ * hs_, R = (NHl_ + 2 * NKVl_) * hs_;
  auto s = std::make_unique<AttentionHalfStash>();
  const Tensor xf = working_f32(ctx, x);  // this rank's n rows under sequence parallelism
  s->x = x;
  Tensor n1 = f32_like(ctx, n, C);
  s->rstd1 = Tensor::empty(*ctx.pool, {n});
  be.rmsnorm_forward(n1.f32(), s->rstd1.f32(), xf.f32(), compute_weight(n1w_).f32(), n, C, eps_);
  s->n1 = store(ctx, n1);
  n1 = {};
  Tensor qkv = f32_like(ctx, N, R);
  linear_forward(ctx, qkv, whole_rows(ctx, s->n1), qkvw_, nullptr);
  rotate(ctx, qkv, false);
  s->qkv = store(ctx, qkv);
  ctx.between_products();
  Tensor atty = f32_like(ctx, N, Cq);
  if (ctx.kv) {  // generation: the new keys and values join the cache; the queries attend over it
    const int pos = ctx.kv->length();
    ctx.kv->store(be, index_, qkv.f32() + Cq, qkv.f32() + Cq + NKVl_ * hs_, R, N);
    be.attention_decode(atty.f32(), qkv.f32(), R, ctx.kv->keys(index_), ctx.kv->values(index_), ctx.kv->width(), N,
                        pos, NHl_, NKVl_, hs_);
  } else {
    s->att = attend(ctx, atty, qkv, Cq, NHl_, NKVl_);
  }
  qkv = {};
  s->atty = store(ctx, atty);
  atty = {};
  ctx.between_products();
  const Tensor h = row_parallel_residual(ctx, s->atty, ow_, xf);  // x + O(atty), summed over the tp ranks
  if (ctx.recompute == Recompute::Selective) {  // recomputed at backward_input
    s->att.reset();
    s->atty = {};
  }
  out = std::move(s);
  return store(ctx, h);
}

// dh -> datty -> dqkv (rotated back) -> dn1 -> dx = dh + ...; under selective
// recomputation attention first, from the stored, rotated qkv with the forward's kernels.
Tensor LlamaAttention::backward_input(const MicrobatchContext& ctx, const Tensor& dy, Stash& stash) {
  auto& s = as<AttentionHalfStash>(stash);
  const int N = ctx.B * ctx.T, n = local_rows(ctx), C = C_, Cq = NHl_ * hs_, R = (NHl_ + 2 * NKVl_) * hs_;
  if (!s.att) {
    Tensor atty = f32_like(ctx, N, Cq);
    s.att = attention_forward_stored(ctx, atty, s.qkv, Cq, NHl_, NKVl_);
    s.atty = store(ctx, atty);
  }
  const Tensor dyf = working_f32(ctx, dy);
  s.dy = whole_rows(ctx, dy);  // the row-parallel product's gradients need every row
  Tensor datty = f32_like(ctx, N, Cq);
  linear_backward_input(ctx, datty, s.dy, ow_);
  ctx.between_products();
  Tensor dqkv = f32_like(ctx, N, R);
  attention_backward_stored(ctx, dqkv, datty, s.qkv, *s.att, Cq, NHl_, NKVl_);
  s.att.reset();
  datty = {};
  ctx.between_products();
  rotate(ctx, dqkv, true);  // the rotation's transpose: gradients of the unrotated projections
  s.dqkv = store(ctx, dqkv);
  dqkv = {};
  Tensor dn1 = f32_like(ctx, N, C);
  linear_backward_input(ctx, dn1, s.dqkv, qkvw_);
  dn1 = finish_row_parallel(ctx, dn1);
  s.dn1 = store(ctx, dn1);
  s.n1 = whole_rows(ctx, s.n1);  // for the weight gradient
  return store(ctx, residual_rmsnorm_dx(ctx, dyf, dn1, s.x, n1w_, s.rstd1, n, C));
}

void LlamaAttention::backward_weight(const MicrobatchContext& ctx, Stash& stash) {
  auto& s = as<AttentionHalfStash>(stash);
  linear_backward_weight(ctx, s.dy, s.atty, ow_, nullptr);
  linear_backward_weight(ctx, s.dqkv, s.n1, qkvw_, nullptr);
  rmsnorm_weight_grad(ctx, n1w_, s.dn1, s.x, s.rstd1, local_rows(ctx), C_);
}

Tensor LlamaMlp::forward(const MicrobatchContext& ctx, const Tensor& x, std::unique_ptr<Stash>& out) {
  Backend& be = *ctx.backend;
  const int N = ctx.B * ctx.T, n = local_rows(ctx), C = C_;
  auto s = std::make_unique<MlpHalfStash>();
  const Tensor hf = working_f32(ctx, x);  // this rank's n rows under sequence parallelism
  s->x = x;
  Tensor n2 = f32_like(ctx, n, C);
  s->rstd2 = Tensor::empty(*ctx.pool, {n});
  be.rmsnorm_forward(n2.f32(), s->rstd2.f32(), hf.f32(), compute_weight(n2w_).f32(), n, C, eps_);
  s->n2 = store(ctx, n2);
  n2 = {};
  Tensor g = f32_like(ctx, N, Fl_), u = f32_like(ctx, N, Fl_), a = f32_like(ctx, N, Fl_);
  const Tensor n2_all = whole_rows(ctx, s->n2);
  linear_forward(ctx, g, n2_all, gatew_, nullptr);
  linear_forward(ctx, u, n2_all, upw_, nullptr);
  s->g = store(ctx, g);  // rounded in place under bf16: the SwiGLU sees the stored values
  s->u = store(ctx, u);
  be.swiglu_forward(a.f32(), g.f32(), u.f32(), static_cast<size_t>(a.numel()));
  g = {};
  u = {};
  s->a = store(ctx, a);
  a = {};
  const Tensor y = row_parallel_residual(ctx, s->a, downw_, hf);
  if (ctx.recompute == Recompute::Selective) s->a = {};  // recomputed at backward_input
  out = std::move(s);
  return store(ctx, y);
}

// dy -> da -> (dg, du) -> dn2 -> dh = dy + ...; under selective recomputation the SwiGLU
// first, from the stored gate and up.
Tensor LlamaMlp::backward_input(const MicrobatchContext& ctx, const Tensor& dy, Stash& stash) {
  Backend& be = *ctx.backend;
  auto& s = as<MlpHalfStash>(stash);
  const int N = ctx.B * ctx.T, n = local_rows(ctx), C = C_;
  const size_t NC = static_cast<size_t>(N) * C, NF = static_cast<size_t>(N) * Fl_;
  if (!s.a.defined()) {
    const Tensor g = working_f32(ctx, s.g), u = working_f32(ctx, s.u), a = f32_like(ctx, N, Fl_);
    be.swiglu_forward(a.f32(), g.f32(), u.f32(), NF);
    s.a = store(ctx, a);
  }
  const Tensor dyf = working_f32(ctx, dy);
  s.dy = whole_rows(ctx, dy);  // the row-parallel product's gradients need every row
  Tensor da = f32_like(ctx, N, Fl_);
  linear_backward_input(ctx, da, s.dy, downw_);
  Tensor dg = f32_like(ctx, N, Fl_), du = f32_like(ctx, N, Fl_);
  be.swiglu_backward(dg.f32(), du.f32(), da.f32(), working_f32(ctx, s.g).f32(), working_f32(ctx, s.u).f32(), NF);
  da = {};
  s.dg = store(ctx, dg);
  s.du = store(ctx, du);
  Tensor dn2 = f32_like(ctx, N, C), part = f32_like(ctx, N, C);
  linear_backward_input(ctx, dn2, s.dg, gatew_);
  linear_backward_input(ctx, part, s.du, upw_);
  be.accumulate(dn2.f32(), part.f32(), NC);
  part = {};
  dg = {};
  du = {};
  dn2 = finish_row_parallel(ctx, dn2);  // column-parallel inputs: sum the partial gradients
  s.dn2 = store(ctx, dn2);
  s.g = {};  // needed by the input gradient only
  s.u = {};
  s.n2 = whole_rows(ctx, s.n2);  // for the weight gradients
  return store(ctx, residual_rmsnorm_dx(ctx, dyf, dn2, s.x, n2w_, s.rstd2, n, C));
}

void LlamaMlp::backward_weight(const MicrobatchContext& ctx, Stash& stash) {
  auto& s = as<MlpHalfStash>(stash);
  linear_backward_weight(ctx, s.dy, s.a, downw_, nullptr);
  linear_backward_weight(ctx, s.dg, s.n2, gatew_, nullptr);
  linear_backward_weight(ctx, s.du, s.n2, upw_, nullptr);
  rmsnorm_weight_grad(ctx, n2w_, s.dn2, s.x, s.rstd2, local_rows(ctx), C_);
}

}  // namespace pipetrain
