// A transformer block as its two residual halves, attention then MLP, run back to back
// (y = m(a(x)); backward in reverse). Each half is a Layer of its own, so a pipeline
// stage may end after a block's attention and the next begin with its MLP
// (partition.hpp); a stage holding both halves runs them as this one layer (under
// train.recompute = "full" the executor then keeps the block's input only). Results are
// the same either way: the residual between the halves is the stored form in both.
#pragma once
#include <memory>
#include <string>

#include "pipetrain/model/layer.hpp"

namespace pipetrain {

// The two halves, built in this order (their parameters are declared attention first).
struct BlockHalves {
  std::unique_ptr<Layer> attention, mlp;
};

class BlockPair : public Layer {
 public:
  BlockPair(std::string name, BlockHalves halves);
  std::string name() const override { return name_; }
  std::vector<Parameter*> parameters() override;
  Tensor forward(const MicrobatchContext& ctx, const Tensor& x, std::unique_ptr<Stash>& stash) override;
  Tensor backward_input(const MicrobatchContext& ctx, const Tensor& dy, Stash& stash) override;
  void backward_weight(const MicrobatchContext& ctx, Stash& stash) override;
  Steps<Tensor> forward_steps(const MicrobatchContext& ctx, Tensor x, std::unique_ptr<Stash>& stash) override;
  Steps<Tensor> backward_input_steps(const MicrobatchContext& ctx, Tensor dy, Stash& stash) override;
  bool recomputable() const override { return true; }
  bool row_sharded() const override { return attention_->row_sharded(); }

 private:
  std::string name_;
  std::unique_ptr<Layer> attention_, mlp_;
};

}  // namespace pipetrain
