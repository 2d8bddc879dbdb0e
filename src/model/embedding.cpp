#include "pipetrain/backend/backend.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/model/embedding.hpp"
#include "pipetrain/model/kv_cache.hpp"
#include "pipetrain/model/linear.hpp"
#include "pipetrain/model/precision.hpp"

namespace pipetrain {

namespace {
struct EmbeddingStash : Stash {
  Tensor tokens, dy;
};
}  // namespace

Parameter& declare_wte(const ModelConfig& cfg, ParameterStore& params, TensorParallel tp) {
  const int64_t Vp = cfg.padded_vocab(), rows = Vp / tp.size;
  Shard shard;
  if (tp.size > 1) shard = Shard{0, {{tp.rank * rows, rows}}};
  Parameter& p = params.declare_shard("wte", {Vp, cfg.d_model}, shard, Init::Normal, 0.02);
  p.init_rows = cfg.vocab_size;  // padded rows stay 0 (they never receive a gradient)
  return p;
}

Parameter& declare_lm_head(const ModelConfig& cfg, ParameterStore& params, TensorParallel tp) {
  const int64_t Vp = cfg.padded_vocab(), rows = Vp / tp.size;
  Shard shard;
  if (tp.size > 1) shard = Shard{0, {{tp.rank * rows, rows}}};
  Parameter& p = params.declare_shard("lm_head.w", {Vp, cfg.d_model}, shard, Init::Normal, 0.02);
  p.init_rows = cfg.vocab_size;
  return p;
}

Embedding::Embedding(const ModelConfig& cfg, ParameterStore& params, TensorParallel tp)
    : C_(cfg.d_model),
      row_begin_(cfg.padded_vocab() / tp.size * tp.rank),
      row_end_(cfg.padded_vocab() / tp.size * (tp.rank + 1)),
      wte_(declare_wte(cfg, params, tp)),
      wpe_(cfg.family().learned_positions ? &params.declare("wpe", {cfg.max_seq_len, cfg.d_model}, Init::Normal, 0.02)
                                          : nullptr),
      max_seq_len_(cfg.max_seq_len) {}

Tensor Embedding::forward(const MicrobatchContext& ctx, const Tensor&, std::unique_ptr<Stash>& stash) {
  const int pos = ctx.kv ? ctx.kv->length() : 0;  // generation: the tokens follow the cached ones
  if (pos + ctx.T > max_seq_len_) fail("sequence length {} exceeds model.max_seq_len {}", pos + ctx.T, max_seq_len_);
  const int N = ctx.B * ctx.T;
  Tensor out = Tensor::empty(*ctx.pool, {N, C_});
  // Each tensor-parallel rank looks up the tokens of its vocabulary slice (0 elsewhere);
  // the sum over ranks is the full lookup. Under bf16 the tables are read as their bf16
  // copies (the rounded weights; no f32 copy of a table is kept for the lookup).
  const bool bf16 = wte_.compute_bf16.defined();
  if (bf16)
    ctx.backend->embedding_lookup(out.f32(), ctx.tokens.i32(), wte_.compute_bf16.bf16_data(), row_begin_, row_end_, N,
                                  C_);
  else
    ctx.backend->embedding_lookup(out.f32(), ctx.tokens.i32(), wte_.value.f32(), row_begin_, row_end_, N, C_);
  layer_util::tp_allreduce(ctx, out);
  if (wpe_) {
    const int64_t at = static_cast<int64_t>(pos) * C_;
    if (bf16)
      ctx.backend->position_add(out.f32(), wpe_->compute_bf16.bf16_data() + at, ctx.B, ctx.T, C_,
                                ctx.document_positions());
    else
      ctx.backend->position_add(out.f32(), wpe_->value.f32() + at, ctx.B, ctx.T, C_, ctx.document_positions());
  }
  auto s = std::make_unique<EmbeddingStash>();
  s->tokens = ctx.tokens;
  stash = std::move(s);
  return layer_util::store(ctx, out);
}

Tensor Embedding::backward_input(const MicrobatchContext&, const Tensor& dy, Stash& stash) {
  layer_util::as<EmbeddingStash>(stash).dy = dy;  // nothing flows further back
  return {};
}

void Embedding::backward_weight(const MicrobatchContext& ctx, Stash& stash) {
  auto& s = layer_util::as<EmbeddingStash>(stash);
  const int N = ctx.B * ctx.T;
  const Tensor dy = layer_util::working_f32(ctx, s.dy);
  if (sink_) {  // keep copies: the step's token buffer and the stash go when the step ends
    Tensor tokens = Tensor::empty(*ctx.pool, {N}, DType::I32), rows = Tensor::empty(*ctx.pool, {N, C_});
    ctx.backend->copy(tokens.raw(), s.tokens.raw(), tokens.bytes());
    ctx.backend->copy(rows.raw(), dy.raw(), rows.bytes());
    sink_->tokens.push_back(std::move(tokens));
    sink_->rows.push_back(std::move(rows));
  } else {
    ctx.backend->embedding_scatter(wte_.grad.f32(), dy.f32(), s.tokens.i32(), row_begin_, row_end_, N, C_);
  }
  if (wpe_) ctx.backend->position_backward(wpe_->grad.f32(), dy.f32(), ctx.B, ctx.T, C_, ctx.document_positions());
}

void Embedding::scatter_rows(Backend& backend, const Tensor& tokens, const Tensor& rows) const {
  backend.embedding_scatter(wte_.grad.f32(), rows.f32(), tokens.i32(), row_begin_, row_end_,
                            static_cast<int>(tokens.numel()), C_);
}

}  // namespace pipetrain
