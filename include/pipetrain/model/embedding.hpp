// The token embedding, plus GPT-2's learned positions (Llama has none: its blocks rotate
// q and k). With tensor parallelism (Megatron-style) each rank holds a slice of the padded
// vocabulary's rows; the lookups are summed over the ranks.
#pragma once
#include "pipetrain/core/config.hpp"
#include "pipetrain/model/layer.hpp"

namespace pipetrain {

class Embedding : public Layer {
 public:
  Embedding(const ModelConfig& cfg, ParameterStore& params, TensorParallel tp = {});
  std::string name() const override { return "embedding"; }
  std::vector<Parameter*> parameters() override {
    if (wpe_) return {&wte_, wpe_};
    return {&wte_};
  }
  Tensor forward(const MicrobatchContext& ctx, const Tensor& x, std::unique_ptr<Stash>& stash) override;
  Tensor backward_input(const MicrobatchContext& ctx, const Tensor& dy, Stash& stash) override;
  void backward_weight(const MicrobatchContext& ctx, Stash& stash) override;

 private:
  int C_, row_begin_, row_end_;
  Parameter& wte_;
  Parameter* wpe_;  // GPT-2's positions; null for Llama
  int max_seq_len_;
};

// The token embedding (this rank's rows), declared once and shared by the embedding and
// the tied LM head when one rank holds both.
Parameter& declare_wte(const ModelConfig& cfg, ParameterStore& params, TensorParallel tp);
// An untied LM head's weight (Llama with model.tie_embeddings = false), sharded as wte.
Parameter& declare_lm_head(const ModelConfig& cfg, ParameterStore& params, TensorParallel tp);

}  // namespace pipetrain
