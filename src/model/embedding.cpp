#include "pipetrain/backend/backend.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/model/gpt2_layers.hpp"

namespace pipetrain {

namespace {
struct EmbeddingStash : Stash {
  Tensor tokens, dy;
};
}  // namespace

Parameter& declare_wte(const ModelConfig& cfg, ParameterStore& params) {
  Parameter& p = params.declare("wte", {cfg.padded_vocab(), cfg.d_model}, Init::Normal, 0.02);
  p.init_rows = cfg.vocab_size;  // padded rows stay 0 (they never receive a gradient)
  return p;
}

Embedding::Embedding(const ModelConfig& cfg, ParameterStore& params)
    : C_(cfg.d_model),
      wte_(declare_wte(cfg, params)),
      wpe_(params.declare("wpe", {cfg.max_seq_len, cfg.d_model}, Init::Normal, 0.02)) {}

Tensor Embedding::forward(const MicrobatchContext& ctx, const Tensor&, std::unique_ptr<Stash>& stash) {
  if (ctx.T > wpe_.shape[0]) fail("sequence length {} exceeds model.max_seq_len {}", ctx.T, wpe_.shape[0]);
  Tensor out = Tensor::empty(*ctx.pool, {ctx.B * ctx.T, C_});
  ctx.backend->embedding_forward(out.f32(), ctx.tokens.i32(), wte_.value.f32(), wpe_.value.f32(),
                                 ctx.B, ctx.T, C_);
  auto s = std::make_unique<EmbeddingStash>();
  s->tokens = ctx.tokens;
  stash = std::move(s);
  return out;
}

Tensor Embedding::backward_input(const MicrobatchContext&, const Tensor& dy, Stash& stash) {
  layer_util::as<EmbeddingStash>(stash).dy = dy;  // nothing flows further back
  return {};
}

void Embedding::backward_weight(const MicrobatchContext& ctx, Stash& stash) {
  auto& s = layer_util::as<EmbeddingStash>(stash);
  ctx.backend->embedding_backward(wte_.grad.f32(), wpe_.grad.f32(), s.dy.f32(), s.tokens.i32(),
                                  ctx.B, ctx.T, C_);
}

}  // namespace pipetrain
