#include "pipetrain/model/stage.hpp"

#include "pipetrain/backend/attention.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/model/block.hpp"
#include "pipetrain/model/embedding.hpp"
#include "pipetrain/model/llama_block.hpp"
#include "pipetrain/model/loss_head.hpp"

namespace pipetrain {

int model_num_units(const ModelConfig& cfg) { return cfg.n_layer + 2; }

ModelStage::ModelStage(const ModelConfig& cfg, int first_unit, int last_unit, ParameterStore& params,
                     TensorParallel tp)
    : first_(first_unit), last_(last_unit), num_units_(model_num_units(cfg)), params_(params) {
  if (cfg.arch != "gpt2" && cfg.arch != "llama") fail("model.arch: unsupported architecture \"{}\"", cfg.arch);
  if (cfg.n_head % tp.size != 0)
    fail("parallel.tp = {} does not divide model.n_head = {} (each rank needs whole heads)", tp.size, cfg.n_head);
  if (cfg.padded_vocab() % tp.size != 0)
    fail("parallel.tp = {} does not divide the padded vocabulary of {}", tp.size, cfg.padded_vocab());
  if (first_ < 0 || last_ > num_units_ || first_ >= last_)
    fail("stage units [{}, {}) outside the model's {} units", first_, last_, num_units_);
  for (int u = first_; u < last_; ++u) {
    if (u == 0)
      layers_.push_back(std::make_unique<Embedding>(cfg, params_, tp));
    else if (u == num_units_ - 1)
      layers_.push_back(std::make_unique<LossHead>(cfg, params_, tp));
    else if (cfg.arch == "llama")
      layers_.push_back(std::make_unique<LlamaBlock>(cfg, u - 1, params_, tp));
    else
      layers_.push_back(std::make_unique<Block>(cfg, u - 1, params_, tp));
  }
}

double model_flops_per_token(const ModelConfig& cfg, int64_t num_params, int seq_len) {
  // An untied embedding table is looked up, not multiplied: its parameters cost no FLOPs.
  const double untied = cfg.tied() ? 0.0 : static_cast<double>(cfg.padded_vocab()) * cfg.d_model;
  return 6.0 * (static_cast<double>(num_params) - untied) +
         6.0 * cfg.n_layer * static_cast<double>(cfg.d_model) * seq_len;
}

}  // namespace pipetrain

namespace pipetrain {

namespace {

// One block's stash: what forward keeps (under `mode`) and the gradients kept for the
// weight pass, in stored elements, and its f32 LayerNorm statistics.
struct BlockBytes {
  double stored, stats;
};
BlockBytes block_stash(const ModelConfig& cfg, int tp, int B, int T, Recompute mode, AttentionKeeps keeps) {
  const double N = static_cast<double>(B) * T, C = cfg.d_model, Cl = C / tp;
  const double NH = static_cast<double>(cfg.n_head) / tp;
  const double per_head = keeps == AttentionKeeps::kCausalBlocks ? static_cast<double>(causal_block_elements(T))
                          : keeps == AttentionKeeps::kSquare     ? static_cast<double>(T) * T
                                                                 : T;
  if (cfg.arch == "llama") {
    // x, n1, h, n2 (N x C), qkv (Rl), atty (Cl), gate, up and their SwiGLU (3 Fl), the
    // probabilities, RMSNorm statistics (2 N); for the weight pass dy, dn2, dh, dn1 (N x C),
    // dg, du (2 Fl), dqkv (Rl).
    const double hs = C / cfg.n_head, Rl = (cfg.n_head + 2.0 * cfg.kv_heads()) * hs / tp, Fl = double(cfg.ffn()) / tp;
    const double probs = B * NH * per_head, grads = N * (4 * C + 2 * Fl + Rl);
    switch (mode) {
      case Recompute::Full: return {N * C, 0};
      case Recompute::Selective: return {N * (4 * C + Rl + 2 * Fl) + grads, 2 * N};
      case Recompute::None: break;
    }
    return {N * (4 * C + Rl + Cl + 3 * Fl) + probs + grads, 2 * N};
  }
  // ln1, res2, ln2 (N x C each), qkv (3 Cl), atty (Cl), fch and its GELU (4 Cl each), the
  // attention probabilities (NH x per_head per sequence), LayerNorm statistics (4 N); then
  // the gradients kept for the weight pass (dy, dres2, dln1, dln2: N x C; dfch, dqkv).
  const double probs = B * NH * per_head, grads = N * (4 * C + 7 * Cl);
  switch (mode) {
    case Recompute::Full: return {N * C, 0};  // the input only
    case Recompute::Selective: return {N * (3 * C + 7 * Cl) + grads, 4 * N};  // no probabilities, atty, GELU
    case Recompute::None: break;
  }
  return {N * (3 * C + 12 * Cl) + probs + grads, 4 * N};
}

}  // namespace

AttentionKeeps attention_keeps(std::string_view device_kind, int head_size) {
  if (device_kind == "cpu") return AttentionKeeps::kCausalBlocks;
  return head_size > 128 ? AttentionKeeps::kSquare : AttentionKeeps::kLogSumExp;
}

double stash_bytes(const ModelConfig& cfg, int first_unit, int last_unit, int tp, int B, int T, DType storage,
                   Recompute mode, AttentionKeeps keeps) {
  const double N = static_cast<double>(B) * T, C = cfg.d_model;
  const BlockBytes block = block_stash(cfg, tp, B, T, mode, keeps);
  // Head: the final LayerNorm output and its gradient, the (d)logits slice, statistics.
  const double head = N * (2 * C + static_cast<double>(cfg.padded_vocab()) / tp), head_stats = 2 * N;
  double stored = 0, stats = 0;
  for (int u = first_unit; u < last_unit; ++u) {
    if (u == 0) {
      stored += N * C;  // the embedding keeps its output gradient
    } else if (u == model_num_units(cfg) - 1) {
      stored += head;
      stats += head_stats;
    } else {
      stored += block.stored;
      stats += block.stats;
    }
  }
  return stored * static_cast<double>(dtype_size(storage)) + stats * 4.0;
}

double recompute_bytes(const ModelConfig& cfg, int tp, int B, int T, DType storage, Recompute mode,
                       AttentionKeeps keeps) {
  if (mode == Recompute::None) return 0;
  const BlockBytes all = block_stash(cfg, tp, B, T, Recompute::None, keeps),
                   kept = block_stash(cfg, tp, B, T, mode, keeps);
  return (all.stored - kept.stored) * static_cast<double>(dtype_size(storage)) + (all.stats - kept.stats) * 4.0;
}

}  // namespace pipetrain
