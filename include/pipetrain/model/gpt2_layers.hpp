// The three GPT-2 layer kinds: token+position embedding, transformer block, and
// the head (final LayerNorm, LM head tied to the token embedding, cross-entropy).
#pragma once
#include "pipetrain/core/config.hpp"
#include "pipetrain/model/layer.hpp"

namespace pipetrain {

class Embedding : public Layer {
 public:
  Embedding(const ModelConfig& cfg, ParameterStore& params);
  std::string name() const override { return "embedding"; }
  Tensor forward(const MicrobatchContext& ctx, const Tensor& x, std::unique_ptr<Stash>& stash) override;
  Tensor backward_input(const MicrobatchContext& ctx, const Tensor& dy, Stash& stash) override;
  void backward_weight(const MicrobatchContext& ctx, Stash& stash) override;

 private:
  int C_;
  Parameter &wte_, &wpe_;
};

class Block : public Layer {
 public:
  Block(const ModelConfig& cfg, int index, ParameterStore& params);
  std::string name() const override { return "block " + std::to_string(index_); }
  Tensor forward(const MicrobatchContext& ctx, const Tensor& x, std::unique_ptr<Stash>& stash) override;
  Tensor backward_input(const MicrobatchContext& ctx, const Tensor& dy, Stash& stash) override;
  void backward_weight(const MicrobatchContext& ctx, Stash& stash) override;

 private:
  int index_, C_, NH_;
  Parameter &ln1w_, &ln1b_, &qkvw_, &qkvb_, &projw_, &projb_;
  Parameter &ln2w_, &ln2b_, &fcw_, &fcb_, &fcprojw_, &fcprojb_;
};

class LossHead : public Layer {
 public:
  LossHead(const ModelConfig& cfg, ParameterStore& params);
  std::string name() const override { return "head"; }
  Tensor forward(const MicrobatchContext& ctx, const Tensor& x, std::unique_ptr<Stash>& stash) override;
  Tensor backward_input(const MicrobatchContext& ctx, const Tensor& dy, Stash& stash) override;
  void backward_weight(const MicrobatchContext& ctx, Stash& stash) override;

 private:
  int C_, V_, Vp_;
  Parameter &lnfw_, &lnfb_, &wte_;
};

constexpr float kLayerNormEps = 1e-5f;

// Parameter declarations shared by layers that hold the same tensor.
Parameter& declare_wte(const ModelConfig& cfg, ParameterStore& params);

}  // namespace pipetrain
