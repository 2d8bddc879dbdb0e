// The model (GPT-2 or Llama, by model.arch) as a sequence of "units" a pipeline stage can
// own a contiguous run of (partition.hpp: the embedding, each block's attention and MLP
// halves, the head). Exports: ModelStage, model_flops_per_token, stage_stash, stash_bytes,
// recompute_bytes, kLayerNormEps.
#pragma once
#include <memory>
#include <string_view>
#include <vector>

#include "pipetrain/core/config.hpp"
#include "pipetrain/model/layer.hpp"
#include "pipetrain/model/partition.hpp"

namespace pipetrain {

// GPT-2's LayerNorm epsilon (blocks and the final norm).
constexpr float kLayerNormEps = 1e-5f;

class ModelStage {
 public:
  // Builds units [first, last) (a layer per stage_pieces entry) and declares their
  // parameters in `params` (shared by all stages of one rank, so a rank holding both ends
  // keeps one tied embedding). vocab_parallel: the embedding unit is only its positions
  // and the head unit only its final norm (vocab_ends.hpp); every rank's VocabSlice holds
  // the rest. ep: the experts of mixture-of-experts layers this rank holds.
  ModelStage(const ModelConfig& cfg, int first_unit, int last_unit, ParameterStore& params, TensorParallel tp = {},
             bool vocab_parallel = false, ExpertParallel ep = {});

  ParameterStore& params() { return params_; }
  std::vector<std::unique_ptr<Layer>>& layers() { return layers_; }
  bool has_embedding() const { return first_ == 0; }
  bool has_head() const { return last_ == num_units_; }

 private:
  int first_, last_, num_units_;
  ParameterStore& params_;
  std::vector<std::unique_ptr<Layer>> layers_;
};

// Model FLOPs per token for training: 6 * params + 6 * n_layer * d_model * seq_len.
double model_flops_per_token(const ModelConfig& cfg, int64_t num_params, int seq_len);

// What attention keeps per (sequence, head) for its backward: the CPU's probabilities in
// causal blocks (pipetrain/backend/attention.hpp), the CUDA probability kernels' T x T
// (head size > 128), or the CUDA flash kernel's log-sum-exp (T values).
enum class AttentionKeeps { kCausalBlocks, kSquare, kLogSumExp };
// Which, for a device kind ("cpu" or "cuda") and a head size.
AttentionKeeps attention_keeps(std::string_view device_kind, int head_size);

// Bytes of activations one microbatch (B sequences of T tokens) keeps stashed in units
// [first, last) on one of `tp` tensor-parallel ranks (what the Block and LossHead stashes
// hold: activations in `storage`, LayerNorm statistics in f32), under recomputation `mode`:
// selective drops a block's attention probabilities and output and its GELU output; full
// keeps the input only of each layer (a whole block, or a half block at the stage's ends).
// `keeps`: what attention keeps per (sequence, head).
// vocab_parallel: the head unit is its final norm only (the logits are the slices').
// sequence_parallel (model/sequence_parallel.hpp): the blocks keep a tp-th of the rows
// between their tensor-parallel regions (inputs, norm outputs and statistics, the norms'
// input gradients), and whole rows only for the weight pass (the row-parallel products'
// output gradients, the gathered norm outputs).
struct StashBytes {
  double kept = 0;                 // from its forward to its backward
  double weight_pass = 0;          // what an input-gradient pass (I) adds until its weight pass (W)
  double largest_weight_pass = 0;  // of one layer: a full backward (B) frees each layer after its weight pass
  double working = 0;              // f32 working copies while its work runs (bf16: the head's logits)
};
StashBytes stage_stash(const ModelConfig& cfg, int first_unit, int last_unit, int tp, int B, int T, DType storage,
                       Recompute mode, AttentionKeeps keeps, bool vocab_parallel, bool sequence_parallel);
// stage_stash(...).kept
double stash_bytes(const ModelConfig& cfg, int first_unit, int last_unit, int tp, int B, int T,
                   DType storage = DType::F32, Recompute mode = Recompute::None,
                   AttentionKeeps keeps = AttentionKeeps::kCausalBlocks, bool vocab_parallel = false,
                   bool sequence_parallel = false);
// What one microbatch's output slice keeps from OF to OB on each of `slices` ranks: its
// logits (f32) and the hidden states it received (as stored).
double vocab_stash_bytes(const ModelConfig& cfg, int slices, int B, int T, DType storage);
// What recomputation holds on top, at most once per stage and for one microbatch at a time:
// the stash of the (whole) block being recomputed (0 for none).
double recompute_bytes(const ModelConfig& cfg, int tp, int B, int T, DType storage, Recompute mode,
                       AttentionKeeps keeps = AttentionKeeps::kCausalBlocks, bool sequence_parallel = false);

}  // namespace pipetrain
