// GPT-2 transformer block (pre-LayerNorm):
//   y = r + MLP(LN2(r)),  r = x + Proj(Attn(QKV(LN1(x))))
#include <cmath>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/model/block.hpp"
#include "pipetrain/model/gpt2.hpp"
#include "pipetrain/model/linear.hpp"

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
// Row-parallel output: partial products summed over the tensor-parallel ranks, then the
// (replicated) bias and the residual.
void row_parallel_out(const MicrobatchContext& ctx, const Tensor& y, const float* x, const Parameter& w,
                      const Parameter& b, const float* residual, int N) {
  Backend& be = *ctx.backend;
  const size_t n = static_cast<size_t>(N) * static_cast<size_t>(w.shape[0]);
  linear_forward(be, y.f32(), x, w, nullptr, N);
  tp_allreduce(ctx, y);
  be.bias_add(y.f32(), b.value.f32(), N, static_cast<int>(w.shape[0]));
  be.accumulate(y.f32(), residual, n);
}
}  // namespace

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
  const int Cl = Cl_;
  s->qkv = Tensor::empty(pool, {N, 3 * Cl});
  linear_forward(be, s->qkv.f32(), s->ln1.f32(), qkvw_, &qkvb_, N);
  s->atty = Tensor::empty(pool, {N, Cl});
  s->att = be.attention_forward(s->atty.f32(), s->qkv.f32(), B, T, Cl, NH_, pool);
  s->res2 = Tensor::empty(pool, {N, C});
  row_parallel_out(ctx, s->res2, s->atty.f32(), projw_, projb_, x.f32(), N);
  s->ln2 = Tensor::empty(pool, {N, C});
  s->mean2 = Tensor::empty(pool, {N});
  s->rstd2 = Tensor::empty(pool, {N});
  be.layernorm_forward(s->ln2.f32(), s->mean2.f32(), s->rstd2.f32(), s->res2.f32(),
                       ln2w_.value.f32(), ln2b_.value.f32(), N, C, kLayerNormEps);
  s->fch = Tensor::empty(pool, {N, 4 * Cl});
  linear_forward(be, s->fch.f32(), s->ln2.f32(), fcw_, &fcb_, N);
  s->fch_gelu = Tensor::empty(pool, {N, 4 * Cl});
  be.gelu_forward(s->fch_gelu.f32(), s->fch.f32(), static_cast<size_t>(N) * 4 * Cl);
  Tensor y = Tensor::empty(pool, {N, C});
  row_parallel_out(ctx, y, s->fch_gelu.f32(), fcprojw_, fcprojb_, s->res2.f32(), N);
  out = std::move(s);
  return y;
}

Tensor Block::backward_input(const MicrobatchContext& ctx, const Tensor& dy, Stash& stash) {
  Backend& be = *ctx.backend;
  MemoryPool& pool = *ctx.pool;
  auto& s = as<BlockStash>(stash);
  const int B = ctx.B, T = ctx.T, N = B * T, C = C_, Cl = Cl_;
  const size_t NC = static_cast<size_t>(N) * C;
  s.dy = dy;
  // MLP branch: dy -> d(fch_gelu) -> d(fch) -> d(ln2) -> d(res2) += ...
  s.dfch = Tensor::empty(pool, {N, 4 * Cl});
  linear_backward_input(be, s.dfch.f32(), dy.f32(), fcprojw_, N);
  be.gelu_backward(s.dfch.f32(), s.fch.f32(), s.dfch.f32(), static_cast<size_t>(N) * 4 * Cl);
  s.dln2 = Tensor::empty(pool, {N, C});
  linear_backward_input(be, s.dln2.f32(), s.dfch.f32(), fcw_, N);
  tp_allreduce(ctx, s.dln2);  // column-parallel input: sum the partial gradients
  s.dres2 = Tensor::empty(pool, {N, C});
  be.copy(s.dres2.f32(), dy.f32(), NC * sizeof(float));
  be.layernorm_backward_input(s.dres2.f32(), s.dln2.f32(), s.res2.f32(), ln2w_.value.f32(),
                              s.mean2.f32(), s.rstd2.f32(), N, C);
  // Attention branch: d(res2) -> d(atty) -> d(qkv) -> d(ln1) -> dx += ...
  Tensor datty = Tensor::empty(pool, {N, Cl});
  linear_backward_input(be, datty.f32(), s.dres2.f32(), projw_, N);
  s.dqkv = Tensor::empty(pool, {N, 3 * Cl});
  be.attention_backward(s.dqkv.f32(), datty.f32(), s.qkv.f32(), *s.att, B, T, Cl, NH_, pool);
  datty = {};
  s.dln1 = Tensor::empty(pool, {N, C});
  linear_backward_input(be, s.dln1.f32(), s.dqkv.f32(), qkvw_, N);
  tp_allreduce(ctx, s.dln1);
  Tensor dx = Tensor::empty(pool, {N, C});
  be.copy(dx.f32(), s.dres2.f32(), NC * sizeof(float));
  be.layernorm_backward_input(dx.f32(), s.dln1.f32(), s.x.f32(), ln1w_.value.f32(), s.mean1.f32(),
                              s.rstd1.f32(), N, C);
  // Activations only the input gradient needed can go now.
  s.att.reset();
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
