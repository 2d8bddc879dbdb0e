// One rank's slice of the vocabulary under vocabulary parallelism (schedule/vocab_pieces.hpp):
// rows [begin, end) of the padded token embedding and of the output layer (one table when
// they are tied), and the computations of its program slices, each split where a
// collective joins the slices:
//   EF  embed_forward:   the tokens of the slice looked up, 0 elsewhere (summed over the
//                        ranks: the embedding);
//   OF  output_forward:  the slice's logits of the final hidden states, kept, and their
//                        softmax statistics per token: log-sum-exp over the slice's real
//                        columns and the target's logit (0 where the target is elsewhere);
//   OB  output_backward: from every slice's statistics, the loss per token and the logits'
//                        gradient; this slice's share of the hidden states' gradient
//                        (summed over the ranks) and its weight gradient;
//   EB  embed_backward:  the embedding output's gradient scattered into the slice's rows.
// The table's shards name the global rows, so checkpoints hold the global table.
#pragma once
#include <memory>

#include "pipetrain/core/config.hpp"
#include "pipetrain/model/layer.hpp"

namespace pipetrain {

// What OF keeps for OB: the hidden states and the logits.
struct VocabOutputStash {
  Tensor x, logits;
};

class VocabSlice {
 public:
  // slice: this slice's index among `slice.size` equal slices of the padded vocabulary.
  VocabSlice(const ModelConfig& cfg, ParameterStore& params, TensorParallel slice);
  std::vector<Parameter*> parameters();
  int row_begin() const { return begin_; }
  int row_end() const { return end_; }

  // EF: out (N, C) f32.
  void embed_forward(const MicrobatchContext& ctx, const Tensor& tokens, const Tensor& out) const;
  // EB: dout (N, C) as stored.
  void embed_backward(const MicrobatchContext& ctx, const Tensor& tokens, const Tensor& dout);
  // OF: x (N, C) as stored; stats (2, N) f32: log-sum-exp, then target logit.
  VocabOutputStash output_forward(const MicrobatchContext& ctx, const Tensor& x, const Tensor& stats) const;
  // OB: all_stats (slices, 2, N) f32, every slice's OF statistics in slice order; losses
  // (N) f32 (the same on every slice). With ctx.loss_scale != 0 also dx (N, C) f32, this
  // slice's share of the hidden states' gradient, and the weight gradient accumulated.
  void output_backward(const MicrobatchContext& ctx, VocabOutputStash& stash, const Tensor& all_stats, int slices,
                       const Tensor& losses, const Tensor* dx);

 private:
  int C_, V_, begin_, end_;
  Parameter& wte_;
  Parameter& head_;  // wte_ when tied
};

}  // namespace pipetrain
