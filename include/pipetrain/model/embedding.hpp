// The token embedding, plus GPT-2's learned positions (Llama has none: its blocks rotate
// q and k). With tensor parallelism (Megatron-style) each rank holds a slice of the padded
// vocabulary's rows; the lookups are summed over the ranks.
#pragma once
#include "pipetrain/core/config.hpp"
#include "pipetrain/model/layer.hpp"

namespace pipetrain {

// The embedding's gradient as what it is, a few rows: each microbatch's tokens and the
// gradient arriving at its output (B*T rows of d_model). When a step's tokens are few
// against the vocabulary, data parallelism exchanges these instead of all-reducing the
// dense table (runtime/dp_reducer.hpp).
struct EmbeddingRowGradients {
  std::vector<Tensor> tokens, rows;  // per microbatch, in the order backward ran: (B*T) i32, (B*T, C) f32
  void clear() {
    tokens.clear();
    rows.clear();
  }
};

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

  // With a sink, backward_weight keeps the token rows' gradients there and leaves
  // wte.grad alone (the positions' gradient is accumulated as always). Null: dense.
  void set_row_sink(EmbeddingRowGradients* sink) { sink_ = sink; }
  bool has_row_sink() const { return sink_ != nullptr; }
  // Adds the rows' gradients to wte.grad (this rank's vocabulary slice), in order.
  void scatter_rows(Backend& backend, const Tensor& tokens, const Tensor& rows) const;

 private:
  int C_, row_begin_, row_end_;
  Parameter& wte_;
  Parameter* wpe_;  // GPT-2's positions; null for Llama
  int max_seq_len_;
  EmbeddingRowGradients* sink_ = nullptr;
};

// The token embedding (this rank's rows), declared once and shared by the embedding and
// the tied LM head when one rank holds both.
Parameter& declare_wte(const ModelConfig& cfg, ParameterStore& params, TensorParallel tp);
// An untied LM head's weight (Llama with model.tie_embeddings = false), sharded as wte.
Parameter& declare_lm_head(const ModelConfig& cfg, ParameterStore& params, TensorParallel tp);

}  // namespace pipetrain
