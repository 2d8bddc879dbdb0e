// Llama transformer block (pre-norm, no biases):
//   h = x + O(Attn(RoPE(QKV(RMSNorm1(x)))))      grouped-query attention, n_kv_head K/V heads
//   y = h + Down(silu(Gate(n)) * Up(n)),  n = RMSNorm2(h)
// Tensor parallel (Megatron): Q, K, V column-parallel by head (each rank whole query and
// key/value heads), Gate and Up column-parallel, O and Down row-parallel (summed over the
// ranks). Parameters: h.<i>.attn_norm.w, attn.qkv.w ([Q; K; V] rows), attn.o.w,
// mlp_norm.w, mlp.gate.w, mlp.up.w, mlp.down.w.
#pragma once
#include "pipetrain/core/config.hpp"
#include "pipetrain/model/layer.hpp"

namespace pipetrain {

class LlamaBlock : public Layer {
 public:
  LlamaBlock(const ModelConfig& cfg, int index, ParameterStore& params, TensorParallel tp = {});
  std::string name() const override { return "llama block " + std::to_string(index_); }
  std::vector<Parameter*> parameters() override { return {&n1w_, &qkvw_, &ow_, &n2w_, &gatew_, &upw_, &downw_}; }
  Tensor forward(const MicrobatchContext& ctx, const Tensor& x, std::unique_ptr<Stash>& stash) override;
  Tensor backward_input(const MicrobatchContext& ctx, const Tensor& dy, Stash& stash) override;
  void backward_weight(const MicrobatchContext& ctx, Stash& stash) override;
  bool recomputable() const override { return true; }

 private:
  void recompute_selective(const MicrobatchContext& ctx, Stash& stash) const;
  void rotate(const MicrobatchContext& ctx, const Tensor& qkv, bool inverse) const;  // RoPE on Q and K
  int index_, C_, hs_, NHl_, NKVl_, Fl_;  // this rank's query heads, key/value heads, MLP width
  float eps_, theta_;
  Parameter &n1w_, &qkvw_, &ow_, &n2w_, &gatew_, &upw_, &downw_;
};

}  // namespace pipetrain
