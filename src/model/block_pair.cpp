// BlockPair of pipetrain/model/block_pair.hpp.
#include "pipetrain/model/block_pair.hpp"

#include "pipetrain/model/sequence_parallel.hpp"

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
// Under sequence parallelism the block takes and returns the attention half's form, and an
// MLP half that sees whole rows (a mixture of experts) gets them converted around it.
Steps<Tensor> BlockPair::forward_steps(const MicrobatchContext& ctx, Tensor x, std::unique_ptr<Stash>& stash) {
  using layer_util::takes_rows;
  using layer_util::to_rows;
  auto s = std::make_unique<PairStash>();
  const bool a = takes_rows(ctx, *attention_), m = takes_rows(ctx, *mlp_);
  const Tensor h = co_await attention_->forward_steps(ctx, x, s->attention);
  ctx.between_products();
  Tensor y = co_await mlp_->forward_steps(ctx, to_rows(ctx, h, a, m), s->mlp);
  stash = std::move(s);
  co_return to_rows(ctx, y, m, a);
}

Steps<Tensor> BlockPair::backward_input_steps(const MicrobatchContext& ctx, Tensor dy, Stash& stash) {
  using layer_util::takes_rows;
  using layer_util::to_rows;
  auto& s = layer_util::as<PairStash>(stash);
  const bool a = takes_rows(ctx, *attention_), m = takes_rows(ctx, *mlp_);
  const Tensor dh = co_await mlp_->backward_input_steps(ctx, to_rows(ctx, dy, a, m), *s.mlp);
  ctx.between_products();
  co_return co_await attention_->backward_input_steps(ctx, to_rows(ctx, dh, m, a), *s.attention);
}

void BlockPair::backward_weight(const MicrobatchContext& ctx, Stash& stash) {
  auto& s = layer_util::as<PairStash>(stash);
  mlp_->backward_weight(ctx, *s.mlp);
  attention_->backward_weight(ctx, *s.attention);
}

}  // namespace pipetrain
