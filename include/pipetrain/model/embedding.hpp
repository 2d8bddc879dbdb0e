// GPT-2's token + position embedding. With tensor parallelism (Megatron-style) each rank
// holds a slice of the padded vocabulary's rows; the lookups are summed over the ranks.
#pragma once
#include "pipetrain/core/config.hpp"
#include "pipetrain/model/layer.hpp"

namespace pipetrain {

class Embedding : public Layer {
 public:
  Embedding(const ModelConfig& cfg, ParameterStore& params, TensorParallel tp = {});
  std::string name() const override { return "embedding"; }
  std::vector<Parameter*> parameters() override { return {&wte_, &wpe_}; }
  Tensor forward(const MicrobatchContext& ctx, const Tensor& x, std::unique_ptr<Stash>& stash) override;
  Tensor backward_input(const MicrobatchContext& ctx, const Tensor& dy, Stash& stash) override;
  void backward_weight(const MicrobatchContext& ctx, Stash& stash) override;

 private:
  int C_, row_begin_, row_end_;
  Parameter &wte_, &wpe_;
};

// The token embedding (this rank's rows), declared once and shared by the embedding and
// the tied LM head when one rank holds both.
Parameter& declare_wte(const ModelConfig& cfg, ParameterStore& params, TensorParallel tp);

}  // namespace pipetrain
