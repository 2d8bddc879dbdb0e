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
  auto s = std::make_unique<PairStash>();
  const Tensor h = attention_->forward(ctx, x, s->attention);
  Tensor y = mlp_->forward(ctx, h, s->mlp);
  stash = std::move(s);
  return y;
}

Tensor BlockPair::backward_input(const MicrobatchContext& ctx, const Tensor& dy, Stash& stash) {
  auto& s = layer_util::as<PairStash>(stash);
  const Tensor dh = mlp_->backward_input(ctx, dy, *s.mlp);
  return attention_->backward_input(ctx, dh, *s.attention);
}

void BlockPair::backward_weight(const MicrobatchContext& ctx, Stash& stash) {
  auto& s = layer_util::as<PairStash>(stash);
  mlp_->backward_weight(ctx, *s.mlp);
  attention_->backward_weight(ctx, *s.attention);
}

}  // namespace pipetrain
