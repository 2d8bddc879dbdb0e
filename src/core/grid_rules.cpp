#include "pipetrain/core/grid_rules.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <utility>

namespace pipetrain {

std::string tp_split_problem(const ModelConfig& m, int tp) {
  if (tp < 1) return fmt::format("parallel.tp ({}) must be > 0", tp);
  if (m.n_head % tp)
    return fmt::format("parallel.tp ({}) must divide model.n_head ({}): each rank holds whole heads", tp, m.n_head);
  if (m.family().grouped_kv && m.kv_heads() % tp)
    return fmt::format("parallel.tp ({}) must divide model.n_kv_head ({}): each rank holds whole key/value heads",
                       tp, m.kv_heads());
  if (m.family().gated_mlp && m.ffn() % tp)
    return fmt::format("parallel.tp ({}) must divide the MLP width ({}, model.ffn_hidden)", tp, m.ffn());
  if (m.padded_vocab() % tp)
    return fmt::format(
        "parallel.tp ({}) must divide the padded vocabulary ({}, model.vocab_size rounded up to a multiple of 128)",
        tp, m.padded_vocab());
  return "";
}

namespace {
bool tp_divides_the_tokens(const GridShape& g, int seq_len) { return (seq_len / std::max(g.cp, 1)) % g.tp == 0; }
}  // namespace

bool sequence_parallel_on(Toggle sp, const GridShape& g, int seq_len) {
  if (g.tp <= 1 || sp == Toggle::Off) return false;
  return sp == Toggle::On || tp_divides_the_tokens(g, seq_len);  // "auto": wherever it can
}

bool sequence_parallel_on(const Config& cfg) {
  return sequence_parallel_on(cfg.parallel.sequence_parallel, cfg.parallel, cfg.train.seq_len);
}

std::string sequence_parallel_problem(const Config& cfg) {
  const int cp = std::max(cfg.parallel.cp, 1);
  if (!sequence_parallel_on(cfg) || tp_divides_the_tokens(cfg.parallel, cfg.train.seq_len)) return "";
  return fmt::format(
      "parallel.tp ({}) must divide train.seq_len / parallel.cp ({}) under sequence parallelism (each rank holds an "
      "equal share of the tokens; set parallel.sequence_parallel = false to keep every token on every tp rank)",
      cfg.parallel.tp, cfg.train.seq_len / cp);
}

std::string context_parallel_problem(const ModelConfig& m, int seq_len, int cp) {
  if (cp < 1) return fmt::format("parallel.cp ({}) must be >= 1", cp);
  if (cp == 1) return "";
  if (seq_len % (2 * cp) != 0)
    return fmt::format("parallel.cp ({}): train.seq_len ({}) must cut into 2 x parallel.cp equal chunks", cp, seq_len);
  if (m.n_experts > 0) return "parallel.cp > 1 with model.n_experts: not in this version";
  return "";
}

std::string context_parallel_problem(const Config& cfg) {
  return context_parallel_problem(cfg.model, cfg.train.seq_len, cfg.parallel.cp);
}

std::string expert_parallel_problem(const ModelConfig& m, const GridShape& g) {
  if (g.ep > 1 && m.n_experts == 0)
    return fmt::format("parallel.ep ({}): the model has no experts to split (model.n_experts = 0)", g.ep);
  if (g.ep < 1 || g.dp % g.ep)
    return fmt::format(
        "parallel.ep ({}) must divide parallel.dp ({}): the experts are split over a stage's "
        "data-parallel ranks",
        g.ep, g.dp);
  if (m.n_experts == 0) return "";
  if (m.n_experts % g.ep)
    return fmt::format("parallel.ep ({}) must divide model.n_experts ({}): each rank holds whole experts", g.ep,
                       m.n_experts);
  if (m.expert_ffn() % g.tp)
    return fmt::format("parallel.tp ({}) must divide the experts' width (model.expert_ffn_hidden: {})", g.tp,
                       m.expert_ffn());
  return "";
}

std::string grid_problem(const Config& cfg) {
  const ParallelConfig& p = cfg.parallel;
  const std::function<std::string()> rules[] = {
      [&] { return grid_shape_problem(p); },
      [&] { return tp_split_problem(cfg.model, p.tp); },
      [&] { return sequence_parallel_problem(cfg); },
      [&] { return context_parallel_problem(cfg); },
      [&] { return expert_parallel_problem(cfg.model, p); },
      [&] { return shard_problem(cfg); },
      [&] { return p.vocab_parallel == Toggle::On ? vocab_parallel_problem(cfg) : ""; },
      [&] {
        return p.layers_per_stage.empty() ? stage_split_problem(cfg.model, int64_t{p.pp} * p.virtual_stages) : "";
      }};
  for (const auto& rule : rules)  // in order: a later rule may divide by what an earlier one checks
    if (std::string problem = rule(); !problem.empty()) return problem;
  return "";
}

std::string grid_shape_problem(const GridShape& g, int64_t ranks) {
  for (const auto& [name, n] : {std::pair{"dp", g.dp}, {"pp", g.pp}, {"cp", g.cp}, {"tp", g.tp}, {"ep", g.ep}})
    if (n < 1) return fmt::format("parallel.{} ({}) must be >= 1", name, n);
  if (g.dp % g.ep)
    return fmt::format(
        "parallel.ep ({}) must divide parallel.dp ({}): the experts are split over a stage's "
        "data-parallel ranks",
        g.ep, g.dp);
  if (ranks >= 0 && g.ranks() != ranks)
    return fmt::format(
        "parallel.dp * parallel.pp * parallel.cp * parallel.tp = {} * {} * {} * {} = {} does not match the {} MPI "
        "ranks of this job",
        g.dp, g.pp, g.cp, g.tp, g.ranks(), ranks);
  return "";
}

std::string stage_split_problem(const ModelConfig& m, int64_t stages) {
  if (stages <= m.n_layer) return "";
  return fmt::format(
      "parallel.pp * parallel.virtual_stages = {} stages is more than the model.n_layer = {} blocks to split", stages,
      m.n_layer);
}

std::string vocab_split_problem(const ModelConfig& m, int slices) {
  if (slices >= 1 && m.padded_vocab() % slices == 0) return "";
  return fmt::format(
      "parallel.vocab_parallel: pp x tp = {} slices do not divide the padded vocabulary ({}, model.vocab_size rounded "
      "up to a multiple of 128); use another grid or parallel.vocab_parallel = false",
      slices, m.padded_vocab());
}

std::string shard_problem(const Config& cfg) {
  const ShardLevel level = shard_level(cfg.parallel);
  if (level < ShardLevel::Gradients) return "";
  const std::string key = fmt::format("parallel.shard = \"{}\"", to_string(level));
  const int group = cfg.parallel.shard_group, ep = cfg.parallel.ep;
  if (group > 0 && ep > 1 && group % ep != 0)
    return fmt::format(
        "parallel.shard_group ({}) must be a multiple of parallel.ep ({}): each group shards the experts over its "
        "ranks holding the same ones",
        group, ep);
  if (cfg.runtime.device != "cpu")
    return fmt::format("{} runs on CPUs only in this version (runtime.device = \"{}\")", key, cfg.runtime.device);
  if (level == ShardLevel::Weights && cfg.runtime.pack_weights == Toggle::On)
    return key + " keeps no whole weights to pack (runtime.pack_weights = \"auto\" or false)";
  return "";
}

std::string vocab_parallel_problem(const Config& cfg) {
  if (shard_level(cfg.parallel) >= ShardLevel::Gradients)
    return fmt::format("parallel.vocab_parallel: parallel.shard = \"{}\" does not shard the vocabulary slices yet",
                       to_string(shard_level(cfg.parallel)));
  if (auto problem = vocab_split_problem(cfg.model, cfg.parallel.pp * cfg.parallel.tp); !problem.empty())
    return problem;
  if (cfg.runtime.device != "cpu")
    return fmt::format("parallel.vocab_parallel runs on CPUs only in this version (runtime.device = \"{}\")",
                       cfg.runtime.device);
  if (!cfg.schedule.file.empty())
    return fmt::format(
        "parallel.vocab_parallel: schedule.file \"{}\" gives no vocabulary slices; use a built-in "
        "schedule.name",
        cfg.schedule.file);
  if (cfg.comm.p2p == "nccl")
    return "parallel.vocab_parallel: comm.p2p = \"nccl\" (in-order transfers) cannot run its collectives yet";
  return "";
}

std::string batch_split_problem(int64_t global_batch, int dp, int microbatches) {
  const int64_t per_step = int64_t{dp} * microbatches;
  if (per_step > 0 && global_batch >= per_step && global_batch % per_step == 0) return "";
  return fmt::format("train.global_batch ({}) must be divisible by parallel.dp * train.microbatches ({})",
                     global_batch, per_step);
}

}  // namespace pipetrain
