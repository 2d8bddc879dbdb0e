// The head: the final norm (GPT-2: LayerNorm lnf.w, lnf.b; Llama: RMSNorm norm.w), the LM
// head (the token embedding when tied — always for GPT-2 — else its own lm_head.w) and
// cross-entropy.
// With tensor parallelism each rank holds a slice of the padded vocabulary's columns and
// the loss is vocab-parallel (max and sum-exp all-reduced; logits never gathered).
#pragma once
#include "pipetrain/core/config.hpp"
#include "pipetrain/model/layer.hpp"

namespace pipetrain {

class LossHead : public Layer {
 public:
  LossHead(const ModelConfig& cfg, ParameterStore& params, TensorParallel tp = {});
  std::string name() const override { return "head"; }
  std::vector<Parameter*> parameters() override {
    if (lnfb_) return {&lnfw_, lnfb_, &wte_};
    return {&lnfw_, &wte_};
  }
  Tensor forward(const MicrobatchContext& ctx, const Tensor& x, std::unique_ptr<Stash>& stash) override;
  Tensor backward_input(const MicrobatchContext& ctx, const Tensor& dy, Stash& stash) override;
  void backward_weight(const MicrobatchContext& ctx, Stash& stash) override;

 private:
  int C_, V_, Vl_, col_begin_;  // Vl_: this rank's columns of the padded vocabulary
  bool rms_;                    // Llama's RMSNorm instead of LayerNorm
  float eps_;
  Parameter& lnfw_;
  Parameter* lnfb_;  // LayerNorm's bias; null for RMSNorm
  Parameter& wte_;   // the LM head's weight (the token embedding when tied)
};

}  // namespace pipetrain
