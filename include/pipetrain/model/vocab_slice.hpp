// One rank's slice of the vocabulary under vocabulary parallelism (schedule/vocab_pieces.hpp):
// rows [begin, end) of the padded token embedding and of the output layer (one table when
// they are tied), and the computations of its program slices, each split where a
// collective joins the slices:
//   EF  embed_forward:   the tokens of the slice looked up, 0 elsewhere (summed over the
//                        ranks: the embedding);
//   OF  output_forward:  the slice's logits of the final hidden states, kept, and their
//                        softmax statistics per token: log-sum-exp over the slice's real
//                        columns and the target's logit (0 where the target is elsewhere);
//                        in training also the slice's softmax partials of the hidden states'
//                        gradient, normalised by its own maximum (merged over the ranks by
//                        Communicator::reduce_softmax_partials: one reduction, no round of
//                        statistics first; hidden_grad finishes it where the last stage runs);
//   OB  output_backward: from every slice's statistics, the loss per token and the logits'
//                        gradient: the slice's weight gradient;
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
  // OF: x (N, C) as stored; stats (2, N) f32: log-sum-exp, then target logit. With
  // partials (N, 2 + 2C) f32 (training): rows [m, s, a, b] of the hidden states' gradient
  // (comm/softmax_partials.hpp) — m the slice's row maximum, s its sum of exp(logit - m),
  // a = P W with P = exp(logits - m) on its columns, b the target's row W[t] (0 elsewhere).
  VocabOutputStash output_forward(const MicrobatchContext& ctx, const Tensor& x, const Tensor& stats,
                                  const Tensor* partials = nullptr) const;
  // The hidden states' gradient dx (N, C) f32 from every slice's partials merged:
  // loss_scale * (a / s - b), the softmax-weighted rows of W less the target's.
  static void hidden_grad(const MicrobatchContext& ctx, const Tensor& merged, const Tensor& dx);
  // OB: all_stats (slices, 2, N) f32, every slice's OF statistics in slice order; losses
  // (N) f32 (the same on every slice). With ctx.loss_scale != 0 also the weight gradient
  // accumulated.
  void output_backward(const MicrobatchContext& ctx, VocabOutputStash& stash, const Tensor& all_stats, int slices,
                       const Tensor& losses);

 private:
  void write_partials(const MicrobatchContext& ctx, const VocabOutputStash& s, const float* max, const float* sums,
                      const Tensor& partials) const;
  int C_, V_, begin_, end_;
  Parameter& wte_;
  Parameter& head_;  // wte_ when tied
};

}  // namespace pipetrain
