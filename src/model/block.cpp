// GPT-2's block halves (pipetrain/model/block.hpp): forward, the two backward halves and
// selective recomputation of each.
#include "pipetrain/model/block.hpp"

#include <cmath>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/model/kv_cache.hpp"
#include "pipetrain/model/linear.hpp"
#include "pipetrain/model/precision.hpp"
#include "pipetrain/model/sequence_parallel.hpp"
#include "pipetrain/model/stage.hpp"

namespace pipetrain {

using namespace layer_util;

namespace {
struct AttentionHalfStash : Stash {
  Tensor x, ln1, mean1, rstd1, qkv, atty;  // forward
  std::unique_ptr<AttentionStash> att;  // the backend's own
  Tensor dy, dqkv, dln1;                   // backward_input, kept for backward_weight
};
struct MlpHalfStash : Stash {
  Tensor x, ln2, mean2, rstd2, fch, fch_gelu;  // forward
  Tensor dy, dfch, dln2;                       // backward_input, kept for backward_weight
};
std::string key(int layer, const char* leaf) { return "h." + std::to_string(layer) + "." + leaf; }

// Shards of this rank (whole tensors without tensor parallelism).
Shard qkv_rows(int C, TensorParallel tp) {  // this rank's heads of Q, K and V
  if (tp.size == 1) return {};
  const int64_t n = C / tp.size, o = tp.rank * n;
  return {0, {{o, n}, {C + o, n}, {2 * C + o, n}}};
}

// Row-parallel output of x's N rows: partial products summed over the tensor-parallel ranks
// (in f32; this rank's rows of the sum under sequence parallelism), then the (replicated)
// bias and the residual (of as many rows); without tensor parallelism all in the product.
Tensor row_parallel_out(const MicrobatchContext& ctx, const Tensor& x, const Parameter& w, const Parameter& b,
                        const Tensor& residual) {
  const int64_t N = x.shape()[0], C = w.shape[0];
  Tensor y = Tensor::empty(*ctx.pool, {N, C});
  if (!tensor_parallel(ctx)) {
    linear_forward(ctx, y, x, w, &b, &residual);
    return y;
  }
  linear_forward(ctx, y, x, w, nullptr);
  y = finish_row_parallel(ctx, y);
  const int64_t n = y.shape()[0];
  ctx.backend->bias_add(y.f32(), compute_weight(b).f32(), static_cast<int>(n), static_cast<int>(C));
  ctx.backend->accumulate(y.f32(), residual.f32(), static_cast<size_t>(n * C));
  return y;
}

// The LayerNorm's weight gradients from this rank's rows (summed over tp under sequence
// parallelism).
void layernorm_weight_grads(const MicrobatchContext& ctx, Parameter& w, Parameter& b, const Tensor& dln,
                            const Tensor& x, const Tensor& mean, const Tensor& rstd, int n, int C) {
  replicated_grads(ctx, {&w, &b}, [&](const std::vector<float*>& g) {
    ctx.backend->layernorm_backward_weight(g[0], g[1], working_f32(ctx, dln).f32(), working_f32(ctx, x).f32(),
                                           mean.f32(), rstd.f32(), n, C);
  });
}

// y = x + LN-branch(x) backward's input half: dx = dy + LN's input gradient of dln.
Tensor residual_layernorm_dx(const MicrobatchContext& ctx, const Tensor& dyf, const Tensor& dln, const Tensor& x,
                             const Parameter& w, const Tensor& mean, const Tensor& rstd, int N, int C) {
  Backend& be = *ctx.backend;
  const Tensor dx = Tensor::empty(*ctx.pool, {N, C});
  be.copy(dx.f32(), dyf.f32(), static_cast<size_t>(N) * C * sizeof(float));
  be.layernorm_backward_input(dx.f32(), dln.f32(), working_f32(ctx, x).f32(), compute_weight(w).f32(), mean.f32(),
                              rstd.f32(), N, C);
  return dx;
}
}  // namespace

Block::Block(const ModelConfig& cfg, int index, ParameterStore& params, TensorParallel tp)
    : BlockPair("block " + std::to_string(index), [&] {
        BlockHalves h;
        h.attention = std::make_unique<GptAttention>(cfg, index, params, tp);
        h.mlp = std::make_unique<GptMlp>(cfg, index, params, tp);
        return h;
      }()) {}

GptAttention::GptAttention(const ModelConfig& cfg, int index, ParameterStore& p, TensorParallel tp)
    : index_(index),
      C_(cfg.d_model),
      NH_(cfg.n_head / tp.size),
      Cl_(cfg.d_model / tp.size),
      ln1w_(p.declare(key(index, "ln1.w"), {C_}, Init::Ones)),
      ln1b_(p.declare(key(index, "ln1.b"), {C_}, Init::Zeros)),
      qkvw_(p.declare_shard(key(index, "attn.qkv.w"), {3 * C_, C_}, qkv_rows(C_, tp), Init::Normal, 0.02)),
      qkvb_(p.declare_shard(key(index, "attn.qkv.b"), {3 * C_}, qkv_rows(C_, tp), Init::Zeros)),
      projw_(p.declare_shard(key(index, "attn.proj.w"), {C_, C_}, tp_slice(1, C_, tp), Init::Normal,
                             0.02 / std::sqrt(2.0 * cfg.n_layer))),
      projb_(p.declare(key(index, "attn.proj.b"), {C_}, Init::Zeros)) {}

GptMlp::GptMlp(const ModelConfig& cfg, int index, ParameterStore& p, TensorParallel tp)
    : index_(index),
      C_(cfg.d_model),
      Fl_(4 * cfg.d_model / tp.size),
      ln2w_(p.declare(key(index, "ln2.w"), {C_}, Init::Ones)),
      ln2b_(p.declare(key(index, "ln2.b"), {C_}, Init::Zeros)),
      fcw_(p.declare_shard(key(index, "mlp.fc.w"), {4 * C_, C_}, tp_slice(0, 4 * C_, tp), Init::Normal, 0.02)),
      fcb_(p.declare_shard(key(index, "mlp.fc.b"), {4 * C_}, tp_slice(0, 4 * C_, tp), Init::Zeros)),
      fcprojw_(p.declare_shard(key(index, "mlp.proj.w"), {C_, 4 * C_}, tp_slice(1, 4 * C_, tp), Init::Normal,
                               0.02 / std::sqrt(2.0 * cfg.n_layer))),
      fcprojb_(p.declare(key(index, "mlp.proj.b"), {C_}, Init::Zeros)) {}

// Forward and backward compute on f32 working tensors and keep the stored form (bf16
// under mixed precision) of everything backward needs; the LayerNorm statistics stay f32.
// store() rounds its f32 argument in place, so what follows computes with stored values.
Tensor GptAttention::forward(const MicrobatchContext& ctx, const Tensor& x, std::unique_ptr<Stash>& out) {
  Backend& be = *ctx.backend;
  MemoryPool& pool = *ctx.pool;
  const int N = ctx.B * ctx.T, n = local_rows(ctx), C = C_, Cl = Cl_;
  auto s = std::make_unique<AttentionHalfStash>();
  Tensor xf = working_f32(ctx, x);  // this rank's n rows under sequence parallelism
  s->x = x;
  Tensor ln1 = Tensor::empty(pool, {n, C});
  s->mean1 = Tensor::empty(pool, {n});
  s->rstd1 = Tensor::empty(pool, {n});
  be.layernorm_forward(ln1.f32(), s->mean1.f32(), s->rstd1.f32(), xf.f32(), compute_weight(ln1w_).f32(),
                       compute_weight(ln1b_).f32(), n, C, kLayerNormEps);
  s->ln1 = store(ctx, ln1);
  ln1 = {};
  Tensor qkv = Tensor::empty(pool, {N, 3 * Cl});
  linear_forward(ctx, qkv, whole_rows(ctx, s->ln1), qkvw_,
                 &qkvb_);  // f32 working tensors go as soon as they are used: the stash is what stays
  s->qkv = store(ctx, qkv);
  Tensor atty = Tensor::empty(pool, {N, Cl});
  if (ctx.kv) {  // generation: the new keys and values join the cache; the queries attend over it
    const int pos = ctx.kv->length();
    ctx.kv->store(be, index_, qkv.f32() + Cl, qkv.f32() + 2 * Cl, 3 * Cl, N);
    be.attention_decode(atty.f32(), qkv.f32(), 3 * Cl, ctx.kv->keys(index_), ctx.kv->values(index_),
                        ctx.kv->width(), N, pos, NH_, NH_, Cl / NH_);
  } else {
    s->att = attend(ctx, atty, qkv, Cl, NH_, NH_);
  }
  qkv = {};
  s->atty = store(ctx, atty);
  atty = {};
  const Tensor r = row_parallel_out(ctx, s->atty, projw_, projb_, xf);
  if (ctx.recompute == Recompute::Selective) {  // recomputed at backward_input
    s->att.reset();
    s->atty = {};
  }
  out = std::move(s);
  return store(ctx, r);
}

// d(r) -> d(atty) -> d(qkv) -> d(ln1) -> dx = dr + ...; under selective recomputation
// attention (probabilities and output) first, from the stored qkv with the forward's kernels.
Tensor GptAttention::backward_input(const MicrobatchContext& ctx, const Tensor& dy, Stash& stash) {
  MemoryPool& pool = *ctx.pool;
  auto& s = as<AttentionHalfStash>(stash);
  const int N = ctx.B * ctx.T, n = local_rows(ctx), C = C_, Cl = Cl_;
  if (!s.att) {
    Tensor atty = Tensor::empty(pool, {N, Cl});
    s.att = attention_forward_stored(ctx, atty, s.qkv, Cl, NH_, NH_);
    s.atty = store(ctx, atty);
  }
  const Tensor dyf = working_f32(ctx, dy);
  s.dy = whole_rows(ctx, dy);  // the row-parallel products' gradients need every row
  Tensor datty = Tensor::empty(pool, {N, Cl});
  linear_backward_input(ctx, datty, s.dy, projw_);
  Tensor dqkv = Tensor::empty(pool, {N, 3 * Cl});
  attention_backward_stored(ctx, dqkv, datty, s.qkv, *s.att, Cl, NH_, NH_);
  s.att.reset();  // the probabilities are the biggest part of the stash
  datty = {};
  s.dqkv = store(ctx, dqkv);
  Tensor dln1 = Tensor::empty(pool, {N, C});
  linear_backward_input(ctx, dln1, s.dqkv, qkvw_);
  dqkv = {};
  dln1 = finish_row_parallel(ctx, dln1);  // column-parallel input: sum the partial gradients
  s.dln1 = store(ctx, dln1);
  s.ln1 = whole_rows(ctx, s.ln1);  // for the weight gradient
  return store(ctx, residual_layernorm_dx(ctx, dyf, dln1, s.x, ln1w_, s.mean1, s.rstd1, n, C));
}

void GptAttention::backward_weight(const MicrobatchContext& ctx, Stash& stash) {
  auto& s = as<AttentionHalfStash>(stash);
  linear_backward_weight(ctx, s.dy, s.atty, projw_, &projb_);
  linear_backward_weight(ctx, s.dqkv, s.ln1, qkvw_, &qkvb_);
  layernorm_weight_grads(ctx, ln1w_, ln1b_, s.dln1, s.x, s.mean1, s.rstd1, local_rows(ctx), C_);
}

Tensor GptMlp::forward(const MicrobatchContext& ctx, const Tensor& x, std::unique_ptr<Stash>& out) {
  Backend& be = *ctx.backend;
  MemoryPool& pool = *ctx.pool;
  const int N = ctx.B * ctx.T, n = local_rows(ctx), C = C_;
  auto s = std::make_unique<MlpHalfStash>();
  const Tensor xf = working_f32(ctx, x);  // this rank's n rows under sequence parallelism
  s->x = x;
  Tensor ln2 = Tensor::empty(pool, {n, C});
  s->mean2 = Tensor::empty(pool, {n});
  s->rstd2 = Tensor::empty(pool, {n});
  be.layernorm_forward(ln2.f32(), s->mean2.f32(), s->rstd2.f32(), xf.f32(), compute_weight(ln2w_).f32(),
                       compute_weight(ln2b_).f32(), n, C, kLayerNormEps);
  s->ln2 = store(ctx, ln2);
  ln2 = {};
  Tensor fch = Tensor::empty(pool, {N, Fl_});
  Tensor fch_gelu = Tensor::empty(pool, {N, Fl_});
  linear_gelu_forward(ctx, fch_gelu, fch, whole_rows(ctx, s->ln2), fcw_, fcb_);
  s->fch = store(ctx, fch);
  fch = {};
  s->fch_gelu = store(ctx, fch_gelu);
  fch_gelu = {};
  const Tensor y = row_parallel_out(ctx, s->fch_gelu, fcprojw_, fcprojb_, xf);
  if (ctx.recompute == Recompute::Selective) s->fch_gelu = {};  // recomputed at backward_input
  out = std::move(s);
  return store(ctx, y);
}

// dy -> d(fch_gelu) -> d(fch) -> d(ln2) -> dx = dy + ...; under selective recomputation
// the GELU first, from the stored pre-activation.
Tensor GptMlp::backward_input(const MicrobatchContext& ctx, const Tensor& dy, Stash& stash) {
  Backend& be = *ctx.backend;
  MemoryPool& pool = *ctx.pool;
  auto& s = as<MlpHalfStash>(stash);
  const int N = ctx.B * ctx.T, n = local_rows(ctx), C = C_;
  const size_t NF = static_cast<size_t>(N) * Fl_;
  if (!s.fch_gelu.defined()) {
    const Tensor fch = working_f32(ctx, s.fch);
    const Tensor fch_gelu = Tensor::empty(pool, {N, Fl_});
    be.gelu_forward(fch_gelu.f32(), fch.f32(), NF);
    s.fch_gelu = store(ctx, fch_gelu);
  }
  const Tensor dyf = working_f32(ctx, dy);
  s.dy = whole_rows(ctx, dy);  // the row-parallel products' gradients need every row
  Tensor dfch = Tensor::empty(pool, {N, Fl_});
  linear_backward_input(ctx, dfch, s.dy, fcprojw_);
  be.gelu_backward(dfch.f32(), working_f32(ctx, s.fch).f32(), dfch.f32(), NF);
  s.dfch = store(ctx, dfch);
  Tensor dln2 = Tensor::empty(pool, {N, C});
  linear_backward_input(ctx, dln2, s.dfch, fcw_);
  dfch = {};
  dln2 = finish_row_parallel(ctx, dln2);  // column-parallel input: sum the partial gradients
  s.dln2 = store(ctx, dln2);
  s.fch = {};  // needed by the input gradient only
  s.ln2 = whole_rows(ctx, s.ln2);  // for the weight gradient
  return store(ctx, residual_layernorm_dx(ctx, dyf, dln2, s.x, ln2w_, s.mean2, s.rstd2, n, C));
}

void GptMlp::backward_weight(const MicrobatchContext& ctx, Stash& stash) {
  auto& s = as<MlpHalfStash>(stash);
  linear_backward_weight(ctx, s.dy, s.fch_gelu, fcprojw_, &fcprojb_);
  linear_backward_weight(ctx, s.dfch, s.ln2, fcw_, &fcb_);
  layernorm_weight_grads(ctx, ln2w_, ln2b_, s.dln2, s.x, s.mean2, s.rstd2, local_rows(ctx), C_);
}

}  // namespace pipetrain
