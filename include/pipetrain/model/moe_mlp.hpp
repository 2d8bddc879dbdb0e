// A Llama block's MLP half as a mixture of experts (ModelConfig::moe(block)):
//   y = x + sum_j w_tj E_{e_tj}(n_t) + S(n_t),   n = RMSNorm(x),
//   E_e(n) = Down_e(silu(Gate_e n) * Up_e n),    S: the shared experts, one SwiGLU,
// the experts e_tj and weights w_tj from the router's logits n Wr^T (backend/moe_routing.hpp).
// Dropless: every expert takes all its tokens. The routed rows are gathered so each
// expert's are contiguous, multiplied by one product per expert, and combined back in
// choice order (Backend::gather_rows, combine_rows): deterministic.
// Under bf16 (ctx.storage) the activations and the stash are stored as the dense layers' are,
// and the products are f32 products of stored values (their weights keep a widened copy on
// every backend: Parameter::f32_products); routing and the exchanged rows stay f32.
// The auxiliary losses join the objective with weight 1/m per microbatch (the step
// objective's, as ctx.loss_scale is the tokens'); their gradient enters at the router.
// Parameters h.<i>.mlp_norm.w, moe.router.w (E, C), moe.gate.w and moe.up.w (E F, C: expert
// e's rows [e F, (e + 1) F)), moe.down.w (E C, F), and, with shared experts,
// moe.shared_gate.w, moe.shared_up.w (S F, C), moe.shared_down.w (C, S F).
// Expert parallelism (ExpertParallel, ctx.ep): a rank holds the rows of its E / ep experts
// of the three expert matrices (shards of the global tensors, `expert_parallel`); the
// routed rows travel to their experts' ranks and back (moe_exchange.hpp). The router and the
// shared experts are whole on every rank.
// Tensor parallelism (TensorParallel, ctx.tp): as the dense MLP's, every expert's (and the
// shared experts') gate and up rows and down columns are split over the tp ranks, which all
// route the same tokens; each rank's outputs are partial sums, added over the tp ranks once
// per token (and the input gradients, and the routing weights' gradients, likewise). Under
// both, a rank's down is a column shard of its experts' rows (Shard::rows).
// With model.router_bias_rate > 0, h.<i>.moe.router.bias (E) is the selection bias
// (backend/moe_routing.hpp): not trained (Parameter::trained), moved after each step by
// update_selection_bias from the step's loads, checkpointed with the weights.
// Exports: MoeMlp, MoeForwardStats.
#pragma once
#include "pipetrain/backend/moe_routing.hpp"
#include "pipetrain/core/config.hpp"
#include "pipetrain/model/layer.hpp"

namespace pipetrain {

// What the last forward's routing measured (the step's metrics read it).
struct MoeForwardStats {
  double load_balance = 0, z = 0;  // the auxiliary losses, before their coefficients
  double max_over_mean_load = 0;   // the busiest expert's rows over the mean
};

class MoeMlp : public Layer {
 public:
  MoeMlp(const ModelConfig& cfg, int index, ParameterStore& params, ExpertParallel ep = {}, TensorParallel tp = {});
  std::string name() const override { return "llama block " + std::to_string(index_) + " experts"; }
  std::vector<Parameter*> parameters() override;
  Tensor forward(const MicrobatchContext& ctx, const Tensor& x, std::unique_ptr<Stash>& stash) override;
  Tensor backward_input(const MicrobatchContext& ctx, const Tensor& dy, Stash& stash) override;
  void backward_weight(const MicrobatchContext& ctx, Stash& stash) override;
  // Pause while the expert-parallel exchange's all-to-alls are in flight (moe_exchange.hpp):
  // the forward at the counts, the dispatch and the combine; backward_input at its dispatch
  // and combine.
  Steps<Tensor> forward_steps(const MicrobatchContext& ctx, Tensor x, std::unique_ptr<Stash>& stash) override;
  Steps<Tensor> backward_input_steps(const MicrobatchContext& ctx, Tensor dy, Stash& stash) override;
  bool recomputable() const override { return true; }
  const MoeForwardStats& last_forward() const { return last_; }
  static std::string selection_bias_name(int block) { return "h." + std::to_string(block) + ".moe.router.bias"; }

 private:
  int index_, C_, F_, E_, SF_;  // width, this rank's expert width, experts, its shared width (0: none)
  int ep_;                      // the expert-parallel ranks (each holds E / ep_ experts)
  int tp_;                      // the tensor-parallel ranks (each holds F / tp_ of each expert's width)
  float eps_;
  RouterSpec spec_;
  Parameter &normw_, &routerw_, &gatew_, &upw_, &downw_;
  Parameter *sgatew_ = nullptr, *supw_ = nullptr, *sdownw_ = nullptr;
  Parameter* bias_ = nullptr;  // the selection bias (router_bias_rate > 0)
  MoeForwardStats last_;
  int64_t exchange_rows_ = 0;  // the high-water mark of its exchanges' local rows (ExpertExchange)
  RouteCounts route(const MicrobatchContext& ctx, const Tensor& n, Stash& stash) const;
};

}  // namespace pipetrain
