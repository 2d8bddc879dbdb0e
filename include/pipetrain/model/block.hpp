// A GPT-2 transformer block (pre-LayerNorm) as its two residual halves (block_pair.hpp):
//   GptAttention  r = x + Proj(Attn(QKV(LN1(x))))
//   GptMlp        y = r + FcProj(GELU(Fc(LN2(r))))
// With tensor parallelism (Megatron-style) each rank holds whole heads of the QKV
// projection (column-parallel) and the matching input slice of the output projection
// (row-parallel, then all-reduce), and a slice of the MLP's hidden units (column- then
// row-parallel). LayerNorms and the biases added after an all-reduce are replicated.
// Parameters: h.<i>.ln1.{w,b}, attn.qkv.{w,b}, attn.proj.{w,b}, ln2.{w,b}, mlp.fc.{w,b},
// mlp.proj.{w,b}.
#pragma once
#include "pipetrain/core/config.hpp"
#include "pipetrain/model/block_pair.hpp"

namespace pipetrain {

class GptAttention : public Layer {
 public:
  GptAttention(const ModelConfig& cfg, int index, ParameterStore& params, TensorParallel tp = {});
  std::string name() const override { return "block " + std::to_string(index_) + " attention"; }
  std::vector<Parameter*> parameters() override { return {&ln1w_, &ln1b_, &qkvw_, &qkvb_, &projw_, &projb_}; }
  Tensor forward(const MicrobatchContext& ctx, const Tensor& x, std::unique_ptr<Stash>& stash) override;
  Tensor backward_input(const MicrobatchContext& ctx, const Tensor& dy, Stash& stash) override;
  void backward_weight(const MicrobatchContext& ctx, Stash& stash) override;
  bool recomputable() const override { return true; }
  bool row_sharded() const override { return true; }  // sequence parallelism: this rank's rows

 private:
  int index_, C_, NH_;  // C_ = d_model; NH_ = this rank's heads
  int Cl_;               // this rank's channels of Q (and K, V): C_ / tp
  Parameter &ln1w_, &ln1b_, &qkvw_, &qkvb_, &projw_, &projb_;
};

class GptMlp : public Layer {
 public:
  GptMlp(const ModelConfig& cfg, int index, ParameterStore& params, TensorParallel tp = {});
  std::string name() const override { return "block " + std::to_string(index_) + " mlp"; }
  std::vector<Parameter*> parameters() override { return {&ln2w_, &ln2b_, &fcw_, &fcb_, &fcprojw_, &fcprojb_}; }
  Tensor forward(const MicrobatchContext& ctx, const Tensor& x, std::unique_ptr<Stash>& stash) override;
  Tensor backward_input(const MicrobatchContext& ctx, const Tensor& dy, Stash& stash) override;
  void backward_weight(const MicrobatchContext& ctx, Stash& stash) override;
  bool recomputable() const override { return true; }
  bool row_sharded() const override { return true; }  // sequence parallelism: this rank's rows

 private:
  int index_, C_, Fl_;  // Fl_: this rank's hidden units, 4 C_ / tp
  Parameter &ln2w_, &ln2b_, &fcw_, &fcb_, &fcprojw_, &fcprojb_;
};

class Block : public BlockPair {
 public:
  Block(const ModelConfig& cfg, int index, ParameterStore& params, TensorParallel tp = {});
};

}  // namespace pipetrain
