// choose_vocab_parallel (pipetrain/plan/vocab_choice.hpp).
#include "pipetrain/plan/vocab_choice.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "pipetrain/core/grid_rules.hpp"
#include "pipetrain/plan/cost_model.hpp"

namespace pipetrain {

VocabChoice choose_vocab_parallel(const Config& cfg, int stages, int microbatch_size) {
  const Toggle t = cfg.parallel.vocab_parallel;
  if (t == Toggle::Off) return {false, ""};
  if (t == Toggle::On) return {true, "parallel.vocab_parallel = true"};
  if (cfg.parallel.pp == 1) return {false, "auto: one pipeline stage holds the whole vocabulary anyway"};
  if (const std::string problem = vocab_parallel_problem(cfg); !problem.empty()) return {false, "auto: " + problem};
  // The work of one microbatch, forward and backward, in FLOPs: the output layer's three
  // products against the blocks' (the embedding is a lookup, its bytes small beside them).
  const ModelConfig& m = cfg.model;
  const int tp = cfg.parallel.tp, B = std::max(1, microbatch_size), T = cfg.train.seq_len;
  auto flops = [&](UnitKind k) {
    const UnitWork w = unit_work(m, k, tp, B, T);
    return w.f_flops + w.i_flops + w.w_flops;
  };
  const double block = flops(UnitKind::Block), head = flops(UnitKind::Head) / block;
  const double share = (m.n_layer + head) / stages;
  if (head > share)
    return {true, fmt::format("auto: the output layer is {:.1f} blocks' work, more than a stage's share ({:.1f} of "
                              "{:.1f} over {} stages)",
                              head, share, m.n_layer + head, stages)};
  return {false, fmt::format("auto: the output layer, {:.1f} blocks' work, fits a stage's share ({:.1f} of {:.1f} over "
                             "{} stages)",
                             head, share, m.n_layer + head, stages)};
}

VocabChoice choose_vocab_parallel(const Config& cfg) {
  const auto& p = cfg.parallel;
  const int per_step = std::max(1, p.dp * cfg.train.microbatches);
  return choose_vocab_parallel(cfg, p.pp * p.virtual_stages, static_cast<int>(cfg.train.global_batch / per_step));
}

Costs vocab_placement_costs(const ModelConfig& m, const GridShape& g, int stages) {
  const double slices = static_cast<double>(g.vocab_slices());
  const double block = 24.0 * m.d_model * m.d_model / g.tp;
  Costs c;
  c.F = c.I = c.W = std::max(1e-3, static_cast<double>(m.n_layer) / stages);
  c.B = 2 * c.F;
  // One product of the slice: OF runs two (the logits, their softmax partials' product with
  // the table), OB one (the weight gradient) — which, its inner dimension the microbatch's
  // tokens and its output the slice's whole gradient, ran as long as OF's two on GPT-2 124M
  // (bench/RESULTS.md): the slices are placed as equals.
  const double product = 2.0 * m.d_model * m.padded_vocab() / slices / block;
  c.vocab = {1e-3, 1.5 * product, 1.5 * product, 1e-3};
  return c;
}

}  // namespace pipetrain
