// A GPT-2 transformer block (pre-LayerNorm attention and MLP, residuals). With tensor
// parallelism (Megatron-style) each rank holds whole heads of the QKV projection
// (column-parallel) and the matching input slice of the output projection (row-parallel,
// then all-reduce), and a slice of the MLP's hidden units (column- then row-parallel).
// LayerNorms and the biases added after an all-reduce are replicated.
#pragma once
#include "pipetrain/core/config.hpp"
#include "pipetrain/model/layer.hpp"

namespace pipetrain {

class Block : public Layer {
 public:
  Block(const ModelConfig& cfg, int index, ParameterStore& params, TensorParallel tp = {});
  std::string name() const override { return "block " + std::to_string(index_); }
  std::vector<Parameter*> parameters() override {
    return {&ln1w_, &ln1b_, &qkvw_, &qkvb_, &projw_, &projb_, &ln2w_, &ln2b_, &fcw_, &fcb_, &fcprojw_, &fcprojb_};
  }
  Tensor forward(const MicrobatchContext& ctx, const Tensor& x, std::unique_ptr<Stash>& stash) override;
  Tensor backward_input(const MicrobatchContext& ctx, const Tensor& dy, Stash& stash) override;
  void backward_weight(const MicrobatchContext& ctx, Stash& stash) override;
  bool recomputable() const override { return true; }

 private:
  void recompute_selective(const MicrobatchContext& ctx, Stash& stash) const;
  int index_, C_, NH_;  // C_ = d_model; NH_ = this rank's heads
  int Cl_;               // this rank's channels of Q (and K, V): C_ / tp
  Parameter &ln1w_, &ln1b_, &qkvw_, &qkvb_, &projw_, &projb_;
  Parameter &ln2w_, &ln2b_, &fcw_, &fcb_, &fcprojw_, &fcprojb_;
};

}  // namespace pipetrain
