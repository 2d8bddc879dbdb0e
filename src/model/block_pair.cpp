// BlockPair of pipetrain/model/block_pair.hpp.
#include "pipetrain/model/block_pair.hpp"

namespace pipetrain {

namespace {
struct PairStash : Stash {
  std::unique_ptr<Stash> attention, mlp;
};
}  // namespace

BlockPair::BlockPair(std::string name, BlockHalves halves)
    : name_(std::move(name)), attention_(std::move(halves.attention)), mlp_(std::move(halves.mlp)) {}

std::vector<Parameter*> BlockPair::parameters() {
  std::vector<Parameter*> all = attention_->parameters();
  for (Parameter* p : mlp_->parameters()) all.push_back(p);
  return all;
}

Tensor BlockPair::forward(const MicrobatchContext& ctx, const Tensor& x, std::unique_ptr<Stash>& stash) {
  return forward_steps(ctx, x, stash).run();
}

Tensor BlockPair::backward_input(const MicrobatchContext& ctx, const Tensor& dy, Stash& stash) {
  return backward_input_steps(ctx, dy, stash).run();
}

// The halves' steps in line: a half that pauses (a mixture of experts' exchange) pauses the block.
Steps<Tensor> BlockPair::forward_steps(const MicrobatchContext& ctx, Tensor x, std::unique_ptr<Stash>& stash) {
  auto s = std::make_unique<PairStash>();
  const Tensor h = co_await attention_->forward_steps(ctx, x, s->attention);
  ctx.between_products();
  Tensor y = co_await mlp_->forward_steps(ctx, h, s->mlp);
  stash = std::move(s);
  co_return y;
}

Steps<Tensor> BlockPair::backward_input_steps(const MicrobatchContext& ctx, Tensor dy, Stash& stash) {
  auto& s = layer_util::as<PairStash>(stash);
  const Tensor dh = co_await mlp_->backward_input_steps(ctx, dy, *s.mlp);
  ctx.between_products();
  co_return co_await attention_->backward_input_steps(ctx, dh, *s.attention);
}

void BlockPair::backward_weight(const MicrobatchContext& ctx, Stash& stash) {
  auto& s = layer_util::as<PairStash>(stash);
  mlp_->backward_weight(ctx, *s.mlp);
  attention_->backward_weight(ctx, *s.attention);
}

}  // namespace pipetrain
