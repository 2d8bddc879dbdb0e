// The run header's shared lines (pipetrain/app/run_header.hpp).
#include "pipetrain/app/run_header.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace pipetrain {

std::string human(double x) {
  const char* units[] = {"", "K", "M", "G", "T"};
  int u = 0;
  while (x >= 1000.0 && u < 4) {
    x /= 1000.0;
    ++u;
  }
  return fmt::format("{:.2f}{}", x, units[u]);
}

// A share as a percentage; a bubble that rounding made a hair below zero prints 0.0, not -0.0.
static double percent(double share) { return std::max(0.0, 100.0 * share); }

std::string model_line(const Config& cfg, int64_t params) {
  const auto& m = cfg.model;
  if (m.family().blocks == BlockKind::Llama) {
    const std::string mlp =
        m.n_experts == 0
            ? fmt::format("MLP {}", m.ffn())
            : fmt::format(
                  "{} of {} blocks a mixture of {} experts of width {} (top {}, {} router{}), the others MLP {}",
                  m.moe_blocks(), m.n_layer, m.n_experts, m.expert_ffn(), m.top_k, m.router,
                  m.n_shared_experts > 0 ? fmt::format(", {} shared", m.n_shared_experts) : "", m.ffn());
    return fmt::format(
        "pipetrain train {}: Llama {} layers, {} heads ({} key/value), d_model {}, {}, {} head, {} "
        "parameters",
        cfg.source, m.n_layer, m.n_head, m.kv_heads(), m.d_model, mlp, m.tie_embeddings ? "tied" : "untied",
        human(static_cast<double>(params)));
  }
  return fmt::format("pipetrain train {}: GPT-2 {} layers, {} heads, d_model {}, {} parameters", cfg.source, m.n_layer,
                     m.n_head, m.d_model, human(static_cast<double>(params)));
}

std::string shard_line(const Config& cfg, const Program& program) {
  if (program.shard_peak.empty()) return "";
  const ShardLevel level = shard_level(cfg.parallel);
  ShardPeak most;
  for (const ShardPeak& p : program.shard_peak)
    most.weights = std::max(most.weights, p.weights), most.gradients = std::max(most.gradients, p.gradients);
  const int replicas = cfg.parallel.replicas();
  const ShardSpans spans = shard_spans(cfg.parallel, cfg.parallel.shard_group);
  const int group = spans.dense;
  // (Experts one rank of the group holds alone stay whole, in place.)
  const std::string experts = cfg.parallel.ep == 1 ? ""
                              : spans.experts > 1  ? fmt::format(" (of the experts 1/{})", spans.experts)
                                                   : " (the experts whole, in place)";
  const std::string kept = level == ShardLevel::Weights ? "weights, gradients and moments" : "gradients and moments";
  const std::string reuse = level == ShardLevel::Weights ? fmt::format(" ({}, prefetch {})", cfg.parallel.shard_reuse,
                                                                       cfg.parallel.shard_prefetch)
                                                         : "";
  return fmt::format(
      "  shard {}{}: each rank keeps 1/{} of the {}{}{}; the program holds at most {:.1f} MiB of weights and "
      "{:.1f} MiB of gradients whole on one rank",
      to_string(level), reuse, group, kept, experts,
      group < replicas ? fmt::format(" (groups of {} replicas)", group) : "",
      4.0 * static_cast<double>(most.weights) / 1048576.0, 4.0 * static_cast<double>(most.gradients) / 1048576.0);
}

std::string grid_line(const GridSummary& g) {
  const std::string why = g.vocab_reason.empty() ? "" : fmt::format(" ({})", g.vocab_reason);
  const std::string vocab = g.vocab_slices > 0 ? fmt::format("; vocabulary parallel: {} slices of {} rows{}",
                                                             g.vocab_slices, g.padded_vocab / g.vocab_slices, why)
                            : why.empty()      ? ""
                                               : "; vocabulary parallel off" + why;
  return fmt::format(
      "  grid {} ({} ranks){}; schedule {}: {} stages, {} microbatches, simulated "
      "bubble {:.1f}% (F=1, B=2); memory estimate {:.0f} MiB per rank (largest){}",
      g.grid.text(), g.grid.ranks(), g.sequence_parallel ? ", sequence parallel" : "", g.schedule, g.stages,
      g.microbatches, percent(g.bubble), g.memory_bytes / 1048576.0, vocab);
}

std::string plan_line(const std::string& note, const Layout& layout, const Prediction& p, const ClusterSpec& cluster) {
  return fmt::format("  plan{}: {}; predicted step {:.1f} ms ({:.0f} tokens/s, {:.1f}% bubble), {:.2f} GiB per "
                     "device (cluster {})",
                     note, describe(layout), 1e3 * p.step_s, p.tokens_per_s, percent(p.bubble_s / p.step_s),
                     p.memory.total() / 1073741824.0, cluster.source);
}

}  // namespace pipetrain
