// A Llama transformer block (pre-norm, no biases) as its two residual halves
// (block_pair.hpp):
//   LlamaAttention  h = x + O(Attn(RoPE(QKV(RMSNorm1(x)))))   grouped-query attention,
//                                                              n_kv_head K/V heads
//   LlamaMlp        y = h + Down(silu(Gate(n)) * Up(n)),  n = RMSNorm2(h)
// Tensor parallel (Megatron): Q, K, V column-parallel by head (each rank whole query and
// key/value heads), Gate and Up column-parallel, O and Down row-parallel (summed over the
// ranks). Parameters: h.<i>.attn_norm.w, attn.qkv.w ([Q; K; V] rows), attn.o.w,
// mlp_norm.w, mlp.gate.w, mlp.up.w, mlp.down.w.
#pragma once
#include "pipetrain/core/config.hpp"
#include "pipetrain/model/block_pair.hpp"

namespace pipetrain {

class LlamaAttention : public Layer {
 public:
  LlamaAttention(const ModelConfig& cfg, int index, ParameterStore& params, TensorParallel tp = {});
  std::string name() const override { return "llama block " + std::to_string(index_) + " attention"; }
  std::vector<Parameter*> parameters() override { return {&n1w_, &qkvw_, &ow_}; }
  Tensor forward(const MicrobatchContext& ctx, const Tensor& x, std::unique_ptr<Stash>& stash) override;
  Tensor backward_input(const MicrobatchContext& ctx, const Tensor& dy, Stash& stash) override;
  void backward_weight(const MicrobatchContext& ctx, Stash& stash) override;
  bool recomputable() const override { return true; }
  bool row_sharded() const override { return true; }  // sequence parallelism: this rank's rows

 private:
  void rotate(const MicrobatchContext& ctx, const Tensor& qkv, bool inverse) const;  // RoPE on Q and K
  int index_, C_, hs_, NHl_, NKVl_;  // this rank's query heads, key/value heads
  float eps_, theta_;
  Parameter &n1w_, &qkvw_, &ow_;
};

class LlamaMlp : public Layer {
 public:
  LlamaMlp(const ModelConfig& cfg, int index, ParameterStore& params, TensorParallel tp = {});
  std::string name() const override { return "llama block " + std::to_string(index_) + " mlp"; }
  std::vector<Parameter*> parameters() override { return {&n2w_, &gatew_, &upw_, &downw_}; }
  Tensor forward(const MicrobatchContext& ctx, const Tensor& x, std::unique_ptr<Stash>& stash) override;
  Tensor backward_input(const MicrobatchContext& ctx, const Tensor& dy, Stash& stash) override;
  void backward_weight(const MicrobatchContext& ctx, Stash& stash) override;
  bool recomputable() const override { return true; }
  bool row_sharded() const override { return true; }  // sequence parallelism: this rank's rows

 private:
  int index_, C_, Fl_;  // this rank's MLP width
  float eps_;
  Parameter &n2w_, &gatew_, &upw_, &downw_;
};

// Block `index`'s MLP half: LlamaMlp, or a mixture of experts where ModelConfig::moe(index)
// (moe_mlp.hpp). Every builder of a Llama MLP half asks here.
std::unique_ptr<Layer> make_llama_mlp(const ModelConfig& cfg, int index, ParameterStore& params, TensorParallel tp,
                                      ExpertParallel ep = {});

class LlamaBlock : public BlockPair {
 public:
  LlamaBlock(const ModelConfig& cfg, int index, ParameterStore& params, TensorParallel tp = {}, ExpertParallel ep = {});
};

}  // namespace pipetrain
