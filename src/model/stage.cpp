#include "pipetrain/model/stage.hpp"

#include "pipetrain/backend/attention.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/core/grid_rules.hpp"
#include "pipetrain/model/block.hpp"
#include "pipetrain/model/embedding.hpp"
#include "pipetrain/model/llama_block.hpp"
#include "pipetrain/model/loss_head.hpp"
#include "pipetrain/model/vocab_ends.hpp"

namespace pipetrain {

namespace {
// A block piece's layer for the model's architecture (model.arch).
template <typename Gpt, typename Llama>
std::unique_ptr<Layer> block_layer(const ModelConfig& cfg, int block, ParameterStore& params, TensorParallel tp) {
  if (cfg.family().blocks == BlockKind::Llama) return std::make_unique<Llama>(cfg, block, params, tp);
  return std::make_unique<Gpt>(cfg, block, params, tp);
}
}  // namespace

ModelStage::ModelStage(const ModelConfig& cfg, int first_unit, int last_unit, ParameterStore& params, TensorParallel tp,
                       bool vocab_parallel, ExpertParallel ep)
    : first_(first_unit), last_(last_unit), num_units_(model_num_units(cfg)), params_(params) {
  const BlockKind blocks = cfg.family().blocks;  // throws for an unknown model.arch
  if (const std::string e = tp_split_problem(cfg, tp.size); !e.empty()) fail("{}", e);
  if (first_ < 0 || last_ > num_units_ || first_ >= last_)
    fail("stage units [{}, {}) outside the model's {} units", first_, last_, num_units_);
  for (const StagePiece& p : stage_pieces(cfg, {first_, last_})) {
    switch (p.kind) {
      case PieceKind::Embedding:
        if (!vocab_parallel)
          layers_.push_back(std::make_unique<Embedding>(cfg, params_, tp));
        else if (cfg.family().learned_positions)
          layers_.push_back(std::make_unique<Positions>(cfg, params_));
        break;
      case PieceKind::Block:
        if (blocks == BlockKind::Llama)
          layers_.push_back(std::make_unique<LlamaBlock>(cfg, p.block, params_, tp, ep));
        else
          layers_.push_back(std::make_unique<Block>(cfg, p.block, params_, tp));
        break;
      case PieceKind::Attention:
        layers_.push_back(block_layer<GptAttention, LlamaAttention>(cfg, p.block, params_, tp));
        break;
      case PieceKind::Mlp:
        if (blocks == BlockKind::Llama)
          layers_.push_back(make_llama_mlp(cfg, p.block, params_, tp, ep));
        else
          layers_.push_back(std::make_unique<GptMlp>(cfg, p.block, params_, tp));
        break;
      case PieceKind::Head:
        if (vocab_parallel)
          layers_.push_back(std::make_unique<FinalNorm>(cfg, params_));
        else
          layers_.push_back(std::make_unique<LossHead>(cfg, params_, tp));
        break;
    }
  }
}

double model_flops_per_token(const ModelConfig& cfg, int64_t num_params, int seq_len) {
  // An untied embedding table is looked up, not multiplied: its parameters cost no FLOPs.
  const double untied = cfg.tied() ? 0.0 : static_cast<double>(cfg.padded_vocab()) * cfg.d_model;
  // A token passes through top_k of a mixture's experts: the others' matrices cost it nothing.
  const double idle_experts =
      3.0 * cfg.d_model * cfg.expert_ffn() * (cfg.n_experts - cfg.top_k) * static_cast<double>(cfg.moe_blocks());
  return 6.0 * (static_cast<double>(num_params) - untied - idle_experts) +
         6.0 * cfg.n_layer * static_cast<double>(cfg.d_model) * seq_len;
}

}  // namespace pipetrain

namespace pipetrain {

namespace {

// The stash of one block half (Attention or Mlp) or of a whole Block, in stored elements:
// what forward keeps (under `mode`) until the backward, what the input-gradient pass adds
// and keeps for the weight pass (the gradients it needs), the f32 norm statistics, and what
// the input-gradient pass drops of the forward's stash without recomputation (attention's
// probabilities, the MLP's inputs to its activation). A half counts its input where the
// other half's output is it (the MLP's input r / h); under full recomputation each layer
// keeps its input only.
struct BlockBytes {
  double stored, weight_pass, stats, dropped = 0;
};
// A mixture of experts' MLP (moe_mlp.cpp), N k routed rows: x, n (N x C), the logits (E,
// on the host), the rows' inputs and outputs (2 C), gate, up and SwiGLU (3 F), the shared experts' (3 S);
// for the weight pass dy, dn, the logits' gradient, the rows' output gradient (C), dg, du
// (2 F), the shared experts' (2 S). Statistics and indices: RMSNorm's, 3 per row. Under tp
// F and S are a rank's share of the width.
BlockBytes moe_stash(const ModelConfig& cfg, double N, int tp) {
  const double C = cfg.d_model, E = cfg.n_experts, k = cfg.top_k, F = double(cfg.expert_ffn()) / tp,
               S = static_cast<double>(cfg.n_shared_experts) * F;
  return {N * (2 * C + E + k * (2 * C + 3 * F) + 3 * S), N * (2 * C + E + k * (C + 2 * F) + 2 * S), N * (1 + 3 * k)};
}

BlockBytes block_stash(const ModelConfig& cfg, PieceKind kind, int block, int tp, int B, int T, Recompute mode,
                       AttentionKeeps keeps, bool sp) {
  sp = sp && tp > 1;
  // Cr: a row's C values on this rank (a tp-th under sequence parallelism); Cw: the whole
  // rows the weight pass keeps beyond them (the gathered norm output; sequence parallel only).
  const double C = cfg.d_model, Cr = sp ? C / tp : C, Cw = sp ? C : 0, rows = sp ? 1.0 / tp : 1.0;
  if (kind == PieceKind::Block) {
    const BlockBytes a = block_stash(cfg, PieceKind::Attention, block, tp, B, T, mode, keeps, sp),
                     m = block_stash(cfg, PieceKind::Mlp, block, tp, B, T, mode, keeps, sp);
    if (mode == Recompute::Full)
      return {static_cast<double>(B) * T * Cr, a.weight_pass + m.weight_pass, 0, a.dropped + m.dropped};
    return {a.stored + m.stored, a.weight_pass + m.weight_pass, a.stats + m.stats, a.dropped + m.dropped};
  }
  const double N = static_cast<double>(B) * T, Cl = C / tp;
  if (mode == Recompute::Full) {  // the weight pass's gradients as without recomputation
    const BlockBytes none = block_stash(cfg, kind, block, tp, B, T, Recompute::None, keeps, sp);
    return {N * Cr, none.weight_pass, 0, none.dropped};
  }
  if (kind == PieceKind::Mlp && block >= 0 && cfg.moe(block)) return moe_stash(cfg, N, tp);  // sees whole rows
  const bool attention = kind == PieceKind::Attention, selective = mode == Recompute::Selective;
  const double NH = static_cast<double>(cfg.n_head) / tp;
  const double per_head = keeps == AttentionKeeps::kCausalBlocks ? static_cast<double>(causal_block_elements(T))
                          : keeps == AttentionKeeps::kSquare     ? static_cast<double>(T) * T
                                                                 : T;
  const double probs = B * NH * per_head;  // selective recomputation drops them and attention's output
  if (cfg.family().blocks == BlockKind::Llama) {
    const double hs = C / cfg.n_head, Rl = (cfg.n_head + 2.0 * cfg.kv_heads()) * hs / tp, Fl = double(cfg.ffn()) / tp;
    // Attention: x, n1 (N x Cr), qkv (Rl), atty (Cl), the probabilities; for the weight pass
    // dh (N x C), dn1 (N x Cr), dqkv (Rl). MLP: h, n2 (N x Cr), gate, up and their SwiGLU
    // (3 Fl); for the weight pass dy (N x C), dn2 (N x Cr), dg, du (2 Fl). RMSNorm
    // statistics: N (rows) each.
    if (attention)
      return {N * (2 * Cr + Rl + (selective ? 0 : Cl)) + (selective ? 0 : probs), N * (C + Cr + Cw + Rl), N * rows,
              probs};
    return {N * (2 * Cr + (selective ? 2 : 3) * Fl), N * (C + Cr + Cw + 2 * Fl), N * rows, N * 2 * Fl};
  }
  // Attention: ln1 (N x Cr), qkv (3 Cl), atty (Cl), the probabilities (NH x per_head per
  // sequence); for the weight pass dr (N x C), dln1 (N x Cr), dqkv (3 Cl). MLP: r, ln2 (N x
  // Cr), fch and its GELU (4 Cl each); for the weight pass dy (N x C), dln2 (N x Cr), dfch
  // (4 Cl). LayerNorm statistics: 2 N (rows) each.
  if (attention)
    return {N * (Cr + (selective ? 3 : 4) * Cl) + (selective ? 0 : probs), N * (C + Cr + Cw + 3 * Cl), 2 * N * rows,
            probs};
  return {N * (2 * Cr + (selective ? 4 : 8) * Cl), N * (C + Cr + Cw + 4 * Cl), 2 * N * rows, N * 4 * Cl};
}

}  // namespace

AttentionKeeps attention_keeps(std::string_view device_kind, int head_size) {
  if (device_kind == "cpu") return AttentionKeeps::kCausalBlocks;
  return head_size > 128 ? AttentionKeeps::kSquare : AttentionKeeps::kLogSumExp;
}

StashBytes stage_stash(const ModelConfig& cfg, int first_unit, int last_unit, int tp, int B, int T, DType storage,
                       Recompute mode, AttentionKeeps keeps, bool vocab_parallel, bool sequence_parallel) {
  const double N = static_cast<double>(B) * T, C = cfg.d_model, bytes = static_cast<double>(dtype_size(storage));
  // Head: the final LayerNorm output and its gradient, the (d)logits slice, statistics.
  const double logits = vocab_parallel ? 0.0 : static_cast<double>(cfg.padded_vocab()) / tp;
  const double head = N * (2 * C + logits), head_stats = 2 * N;
  double stored = 0, stats = 0;
  StashBytes out;
  for (const StagePiece& p : stage_pieces(cfg, {first_unit, last_unit})) {
    if (p.kind == PieceKind::Embedding) {
      stored += N * C;  // the embedding keeps its output gradient
    } else if (p.kind == PieceKind::Head) {
      stored += head;
      stats += head_stats;
      // Stored below f32, its logits are computed in f32 and rounded, and their gradient
      // widened again for each product that reads it: one f32 slice while the head works.
      if (storage != DType::F32) out.working = N * logits * 4.0;
    } else {
      const BlockBytes b = block_stash(cfg, p.kind, p.block, tp, B, T, mode, keeps, sequence_parallel);
      const BlockBytes none = block_stash(cfg, p.kind, p.block, tp, B, T, Recompute::None, keeps, sequence_parallel);
      stored += b.stored;
      stats += b.stats;
      // Between an input-gradient pass and its weight pass a piece also holds what
      // recomputation rebuilt, less what the pass dropped.
      out.weight_pass += (b.weight_pass + none.stored - b.stored - none.dropped) * bytes + (none.stats - b.stats) * 4.0;
      out.largest_weight_pass = std::max(out.largest_weight_pass, b.weight_pass * bytes);
    }
  }
  out.kept = stored * bytes + stats * 4.0;
  return out;
}

double stash_bytes(const ModelConfig& cfg, int first_unit, int last_unit, int tp, int B, int T, DType storage,
                   Recompute mode, AttentionKeeps keeps, bool vocab_parallel, bool sequence_parallel) {
  return stage_stash(cfg, first_unit, last_unit, tp, B, T, storage, mode, keeps, vocab_parallel, sequence_parallel)
      .kept;
}

double vocab_stash_bytes(const ModelConfig& cfg, int slices, int B, int T, DType storage) {
  const double N = static_cast<double>(B) * T;
  return N * static_cast<double>(cfg.padded_vocab()) / slices * 4.0 +
         N * cfg.d_model * static_cast<double>(dtype_size(storage));
}

double recompute_bytes(const ModelConfig& cfg, int tp, int B, int T, DType storage, Recompute mode,
                       AttentionKeeps keeps, bool sequence_parallel) {
  if (mode == Recompute::None) return 0;
  const BlockBytes all = block_stash(cfg, PieceKind::Block, -1, tp, B, T, Recompute::None, keeps, sequence_parallel),
                   kept = block_stash(cfg, PieceKind::Block, -1, tp, B, T, mode, keeps, sequence_parallel);
  return (all.stored - kept.stored) * static_cast<double>(dtype_size(storage)) + (all.stats - kept.stats) * 4.0;
}

}  // namespace pipetrain
