// GPT-2 transformer block (pre-LayerNorm):
//   y = r + MLP(LN2(r)),  r = x + Proj(Attn(QKV(LN1(x))))
#include <cmath>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/model/block.hpp"
#include "pipetrain/model/kv_cache.hpp"
#include "pipetrain/model/stage.hpp"
#include "pipetrain/model/linear.hpp"
#include "pipetrain/model/precision.hpp"

namespace pipetrain {

using namespace layer_util;

namespace {
struct BlockStash : Stash {
  // forward
  Tensor x, ln1, mean1, rstd1, qkv, atty, res2, ln2, mean2, rstd2, fch, fch_gelu;
  std::unique_ptr<AttentionStash> att;  // the backend's own
  // backward_input, kept for backward_weight
  Tensor dy, dfch, dln2, dres2, dqkv, dln1;
};
std::string key(int layer, const char* leaf) { return "h." + std::to_string(layer) + "." + leaf; }

// Shards of this rank (whole tensors without tensor parallelism).
Shard qkv_rows(int C, TensorParallel tp) {  // this rank's heads of Q, K and V
  if (tp.size == 1) return {};
  const int64_t n = C / tp.size, o = tp.rank * n;
  return {0, {{o, n}, {C + o, n}, {2 * C + o, n}}};
}
Shard slice(int dim, int64_t total, TensorParallel tp) {
  if (tp.size == 1) return {};
  const int64_t n = total / tp.size;
  return {dim, {{tp.rank * n, n}}};
}
}  // namespace

Block::Block(const ModelConfig& cfg, int index, ParameterStore& p, TensorParallel tp)
    : index_(index),
      C_(cfg.d_model),
      NH_(cfg.n_head / tp.size),
      Cl_(cfg.d_model / tp.size),
      ln1w_(p.declare(key(index, "ln1.w"), {C_}, Init::Ones)),
      ln1b_(p.declare(key(index, "ln1.b"), {C_}, Init::Zeros)),
      qkvw_(p.declare_shard(key(index, "attn.qkv.w"), {3 * C_, C_}, qkv_rows(C_, tp), Init::Normal, 0.02)),
      qkvb_(p.declare_shard(key(index, "attn.qkv.b"), {3 * C_}, qkv_rows(C_, tp), Init::Zeros)),
      projw_(p.declare_shard(key(index, "attn.proj.w"), {C_, C_}, slice(1, C_, tp), Init::Normal,
                             0.02 / std::sqrt(2.0 * cfg.n_layer))),
      projb_(p.declare(key(index, "attn.proj.b"), {C_}, Init::Zeros)),
      ln2w_(p.declare(key(index, "ln2.w"), {C_}, Init::Ones)),
      ln2b_(p.declare(key(index, "ln2.b"), {C_}, Init::Zeros)),
      fcw_(p.declare_shard(key(index, "mlp.fc.w"), {4 * C_, C_}, slice(0, 4 * C_, tp), Init::Normal, 0.02)),
      fcb_(p.declare_shard(key(index, "mlp.fc.b"), {4 * C_}, slice(0, 4 * C_, tp), Init::Zeros)),
      fcprojw_(p.declare_shard(key(index, "mlp.proj.w"), {C_, 4 * C_}, slice(1, 4 * C_, tp), Init::Normal,
                               0.02 / std::sqrt(2.0 * cfg.n_layer))),
      fcprojb_(p.declare(key(index, "mlp.proj.b"), {C_}, Init::Zeros)) {}

namespace {
// Row-parallel output: partial products summed over the tensor-parallel ranks (in f32),
// then the (replicated) bias and the residual; without tensor parallelism all in the product.
void row_parallel_out(const MicrobatchContext& ctx, const Tensor& y, const Tensor& x, const Parameter& w,
                      const Parameter& b, const Tensor& residual, int N) {
  Backend& be = *ctx.backend;
  if (!tensor_parallel(ctx)) {
    linear_forward(ctx, y, x, w, &b, &residual);
    return;
  }
  const size_t n = static_cast<size_t>(N) * static_cast<size_t>(w.shape[0]);
  linear_forward(ctx, y, x, w, nullptr);
  tp_allreduce(ctx, y);
  be.bias_add(y.f32(), compute_weight(b).f32(), N, static_cast<int>(w.shape[0]));
  be.accumulate(y.f32(), residual.f32(), n);
}
}  // namespace

// Forward and backward compute on f32 working tensors and keep the stored form (bf16
// under mixed precision) of everything backward needs; the LayerNorm statistics stay f32.
Tensor Block::forward(const MicrobatchContext& ctx, const Tensor& x, std::unique_ptr<Stash>& out) {
  Backend& be = *ctx.backend;
  MemoryPool& pool = *ctx.pool;
  const int B = ctx.B, T = ctx.T, N = B * T, C = C_, Cl = Cl_;
  auto s = std::make_unique<BlockStash>();
  Tensor xf = working_f32(ctx, x);
  s->x = x;
  Tensor ln1 = Tensor::empty(pool, {N, C});
  s->mean1 = Tensor::empty(pool, {N});
  s->rstd1 = Tensor::empty(pool, {N});
  be.layernorm_forward(ln1.f32(), s->mean1.f32(), s->rstd1.f32(), xf.f32(), compute_weight(ln1w_).f32(),
                       compute_weight(ln1b_).f32(), N, C, kLayerNormEps);
  s->ln1 = store(ctx, ln1);
  Tensor qkv = Tensor::empty(pool, {N, 3 * Cl});
  linear_forward(ctx, qkv, s->ln1, qkvw_, &qkvb_);
  ln1 = {};  // f32 working tensors go as soon as they are used: the stash is what stays
  s->qkv = store(ctx, qkv);
  Tensor atty = Tensor::empty(pool, {N, Cl});
  if (ctx.kv) {  // generation: the new keys and values join the cache; the queries attend over it
    const int pos = ctx.kv->length();
    ctx.kv->store(be, index_, qkv.f32() + Cl, qkv.f32() + 2 * Cl, 3 * Cl, N);
    be.attention_decode(atty.f32(), qkv.f32(), 3 * Cl, ctx.kv->keys(index_), ctx.kv->values(index_),
                        ctx.kv->width(), N, pos, NH_, NH_, Cl / NH_);
  } else {
    s->att = be.attention_forward(atty.f32(), qkv.f32(), B, T, Cl, NH_, NH_, pool, ctx.storage);
  }
  qkv = {};
  s->atty = store(ctx, atty);
  const Tensor res2 = Tensor::empty(pool, {N, C});
  row_parallel_out(ctx, res2, s->atty, projw_, projb_, xf, N);
  atty = {};
  xf = {};
  s->res2 = store(ctx, res2);
  Tensor ln2 = Tensor::empty(pool, {N, C});
  s->mean2 = Tensor::empty(pool, {N});
  s->rstd2 = Tensor::empty(pool, {N});
  be.layernorm_forward(ln2.f32(), s->mean2.f32(), s->rstd2.f32(), res2.f32(), compute_weight(ln2w_).f32(),
                       compute_weight(ln2b_).f32(), N, C, kLayerNormEps);
  s->ln2 = store(ctx, ln2);
  Tensor fch = Tensor::empty(pool, {N, 4 * Cl});
  Tensor fch_gelu = Tensor::empty(pool, {N, 4 * Cl});
  linear_gelu_forward(ctx, fch_gelu, fch, s->ln2, fcw_, fcb_);
  ln2 = {};
  s->fch = store(ctx, fch);
  fch = {};
  s->fch_gelu = store(ctx, fch_gelu);
  fch_gelu = {};
  const Tensor y = Tensor::empty(pool, {N, C});
  row_parallel_out(ctx, y, s->fch_gelu, fcprojw_, fcprojb_, res2, N);
  if (ctx.recompute == Recompute::Selective) {  // recomputed at backward_input
    s->att.reset();
    s->atty = {};
    s->fch_gelu = {};
  }
  out = std::move(s);
  return store(ctx, y);
}

// Selective recomputation: attention (probabilities and output) from the stored qkv and
// the GELU from the stored pre-activation, with the forward's kernels.
void Block::recompute_selective(const MicrobatchContext& ctx, Stash& stash) const {
  Backend& be = *ctx.backend;
  auto& s = as<BlockStash>(stash);
  const int N = ctx.B * ctx.T, Cl = Cl_;
  Tensor atty = Tensor::empty(*ctx.pool, {N, Cl});
  s.att = attention_forward_stored(ctx, atty, s.qkv, Cl, NH_, NH_);
  s.atty = store(ctx, atty);
  const Tensor fch = working_f32(ctx, s.fch);
  const Tensor fch_gelu = Tensor::empty(*ctx.pool, {N, 4 * Cl});
  be.gelu_forward(fch_gelu.f32(), fch.f32(), static_cast<size_t>(fch.numel()));
  s.fch_gelu = store(ctx, fch_gelu);
}

Tensor Block::backward_input(const MicrobatchContext& ctx, const Tensor& dy, Stash& stash) {
  Backend& be = *ctx.backend;
  MemoryPool& pool = *ctx.pool;
  auto& s = as<BlockStash>(stash);
  const int B = ctx.B, T = ctx.T, N = B * T, C = C_, Cl = Cl_;
  const size_t NC = static_cast<size_t>(N) * C;
  if (!s.att) recompute_selective(ctx, stash);
  const Tensor dyf = working_f32(ctx, dy);
  s.dy = dy;
  // MLP branch: dy -> d(fch_gelu) -> d(fch) -> d(ln2) -> d(res2) += ...
  Tensor dfch = Tensor::empty(pool, {N, 4 * Cl});
  linear_backward_input(ctx, dfch, dy, fcprojw_);
  be.gelu_backward(dfch.f32(), working_f32(ctx, s.fch).f32(), dfch.f32(), static_cast<size_t>(N) * 4 * Cl);
  s.dfch = store(ctx, dfch);
  Tensor dln2 = Tensor::empty(pool, {N, C});
  linear_backward_input(ctx, dln2, s.dfch, fcw_);
  dfch = {};
  tp_allreduce(ctx, dln2);  // column-parallel input: sum the partial gradients
  s.dln2 = store(ctx, dln2);
  Tensor dres2 = Tensor::empty(pool, {N, C});
  be.copy(dres2.f32(), dyf.f32(), NC * sizeof(float));
  be.layernorm_backward_input(dres2.f32(), dln2.f32(), working_f32(ctx, s.res2).f32(), compute_weight(ln2w_).f32(),
                              s.mean2.f32(), s.rstd2.f32(), N, C);
  dln2 = {};
  s.dres2 = store(ctx, dres2);
  // Attention branch: d(res2) -> d(atty) -> d(qkv) -> d(ln1) -> dx += ...
  Tensor datty = Tensor::empty(pool, {N, Cl});
  linear_backward_input(ctx, datty, s.dres2, projw_);
  Tensor dqkv = Tensor::empty(pool, {N, 3 * Cl});
  attention_backward_stored(ctx, dqkv, datty, s.qkv, *s.att, Cl, NH_, NH_);
  s.att.reset();  // the probabilities are the biggest part of the stash
  datty = {};
  s.dqkv = store(ctx, dqkv);
  Tensor dln1 = Tensor::empty(pool, {N, C});
  linear_backward_input(ctx, dln1, s.dqkv, qkvw_);
  dqkv = {};
  tp_allreduce(ctx, dln1);
  s.dln1 = store(ctx, dln1);
  const Tensor dx = Tensor::empty(pool, {N, C});
  be.copy(dx.f32(), dres2.f32(), NC * sizeof(float));
  dres2 = {};
  be.layernorm_backward_input(dx.f32(), dln1.f32(), working_f32(ctx, s.x).f32(), compute_weight(ln1w_).f32(),
                              s.mean1.f32(), s.rstd1.f32(), N, C);
  dln1 = {};
  s.fch = {};  // needed by the input gradient only
  return store(ctx, dx);
}

void Block::backward_weight(const MicrobatchContext& ctx, Stash& stash) {
  Backend& be = *ctx.backend;
  auto& s = as<BlockStash>(stash);
  const int N = ctx.B * ctx.T, C = C_;
  auto f = [&](const Tensor& t) { return working_f32(ctx, t); };
  linear_backward_weight(ctx, s.dy, s.fch_gelu, fcprojw_, &fcprojb_);
  linear_backward_weight(ctx, s.dfch, s.ln2, fcw_, &fcb_);
  be.layernorm_backward_weight(ln2w_.grad.f32(), ln2b_.grad.f32(), f(s.dln2).f32(), f(s.res2).f32(), s.mean2.f32(),
                               s.rstd2.f32(), N, C);
  linear_backward_weight(ctx, s.dres2, s.atty, projw_, &projb_);
  linear_backward_weight(ctx, s.dqkv, s.ln1, qkvw_, &qkvb_);
  be.layernorm_backward_weight(ln1w_.grad.f32(), ln1b_.grad.f32(), f(s.dln1).f32(), f(s.x).f32(), s.mean1.f32(),
                               s.rstd1.f32(), N, C);
}

}  // namespace pipetrain
