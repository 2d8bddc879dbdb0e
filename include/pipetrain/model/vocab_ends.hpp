// What stays on the first and the last stage under vocabulary parallelism, where every
// rank's VocabSlice holds the embedding's and the output layer's rows: GPT-2's learned
// positions, added to the summed lookup (Llama has none), and the final norm, whose output
// the last stage hands to every rank's output slice (and whose input gradient comes back
// summed). Parameters keep the names of the whole layers (wpe; lnf.w, lnf.b or norm.w), so
// checkpoints are the same with vocabulary parallelism on or off.
#pragma once
#include "pipetrain/core/config.hpp"
#include "pipetrain/model/layer.hpp"

namespace pipetrain {

class Positions : public Layer {
 public:
  Positions(const ModelConfig& cfg, ParameterStore& params);
  std::string name() const override { return "positions"; }
  std::vector<Parameter*> parameters() override { return {&wpe_}; }
  // x: the summed token lookup (N, C) as stored.
  Tensor forward(const MicrobatchContext& ctx, const Tensor& x, std::unique_ptr<Stash>& stash) override;
  // The gradient passes through unchanged (it is the lookup's gradient).
  Tensor backward_input(const MicrobatchContext& ctx, const Tensor& dy, Stash& stash) override;
  void backward_weight(const MicrobatchContext& ctx, Stash& stash) override;

 private:
  int C_;
  Parameter& wpe_;
};

class FinalNorm : public Layer {
 public:
  FinalNorm(const ModelConfig& cfg, ParameterStore& params);
  std::string name() const override { return "final norm"; }
  std::vector<Parameter*> parameters() override {
    if (b_) return {&w_, b_};
    return {&w_};
  }
  Tensor forward(const MicrobatchContext& ctx, const Tensor& x, std::unique_ptr<Stash>& stash) override;
  Tensor backward_input(const MicrobatchContext& ctx, const Tensor& dy, Stash& stash) override;
  void backward_weight(const MicrobatchContext& ctx, Stash& stash) override;

 private:
  int C_;
  bool rms_;
  float eps_;
  Parameter& w_;
  Parameter* b_;  // GPT-2's LayerNorm bias; null for Llama's RMSNorm
};

}  // namespace pipetrain
