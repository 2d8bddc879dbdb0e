// tp_slice(), parse_recompute(), to_string(Recompute) and Layer's default steps (pipetrain/model/layer.hpp).
#include "pipetrain/model/layer.hpp"

#include "pipetrain/core/error.hpp"

namespace pipetrain {

Shard tp_slice(int dim, int64_t total, TensorParallel tp) {
  if (tp.size == 1) return {};
  const int64_t n = total / tp.size;
  return {dim, {{tp.rank * n, n}}};
}

Recompute parse_recompute(const std::string& mode) {
  if (mode == "none") return Recompute::None;
  if (mode == "selective") return Recompute::Selective;
  if (mode == "full") return Recompute::Full;
  fail("train.recompute: unknown mode \"{}\" (expected \"none\", \"selective\" or \"full\")", mode);
}

const char* to_string(Recompute mode) {
  switch (mode) {
    case Recompute::Selective: return "selective";
    case Recompute::Full: return "full";
    case Recompute::None: break;
  }
  return "none";
}

Steps<Tensor> Layer::forward_steps(const MicrobatchContext& ctx, Tensor x, std::unique_ptr<Stash>& stash) {
  co_return forward(ctx, x, stash);
}

Steps<Tensor> Layer::backward_input_steps(const MicrobatchContext& ctx, Tensor dy, Stash& stash) {
  co_return backward_input(ctx, dy, stash);
}

}  // namespace pipetrain
