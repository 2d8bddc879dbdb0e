// validate_config: every cross-key rule of a run configuration (sizes, the grid, the
// schedule's placement, the data and checkpoint settings), each failing with one line
// that names the file and the key.
#include <fmt/format.h>

#include <cmath>
#include <string>

#include "config_keys.hpp"
#include "pipetrain/core/config.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/core/grid_rules.hpp"

namespace pipetrain {

using namespace config_keys;

namespace {

// The checks' one-line errors, each prefixed with the file's name.
struct Checker {
  std::string pre;
  void check(bool ok, const std::string& msg) const {
    if (!ok) throw Error(pre + msg);
  }
  // A grid rule of grid_rules.hpp: its problem, if any.
  void rule(const std::string& problem) const { check(problem.empty(), problem); }
  void at_least(const char* key, int64_t v, int64_t min) const {
    check(v >= min, fmt::format("{} ({}) must be {}", key, v, min == 1 ? "> 0" : fmt::format(">= {}", min)));
  }
};

void check_numbers_finite(const Checker& c, const Config& cfg) {
  Config copy = cfg;
  for (const auto& k : kKeys)
    if (const Ref r = k.ref(copy); const auto* d = std::get_if<double*>(&r))
      c.check(std::isfinite(**d), fmt::format("{}: must be a finite number, got {}", k.full(), format_double(**d)));
}

// Mixture of experts: a Llama model's keys, each checked against its bounds.
void check_experts(const Checker& c, const ModelConfig& m) {
  c.at_least("model.n_experts", m.n_experts, 0);
  c.check(m.n_experts > 0 || !m.router_force_balance,
          "model.router_force_balance: the model has no experts to balance");
  if (m.n_experts == 0) return;
  c.check(m.family().experts, fmt::format("model.n_experts ({}): experts replace Llama's MLPs (model.arch = "
                                          "\"llama\"), not {}'s",
                                          m.n_experts, m.family().name));
  c.check(m.top_k >= 1 && m.top_k <= m.n_experts,
          fmt::format("model.top_k ({}) must be between 1 and model.n_experts ({})", m.top_k, m.n_experts));
  c.at_least("model.expert_ffn_hidden", m.expert_ffn_hidden, 0);
  c.at_least("model.n_shared_experts", m.n_shared_experts, 0);
  c.at_least("model.moe_every", m.moe_every, 1);
  c.at_least("model.first_dense", m.first_dense, 0);
  c.check(m.first_dense < m.n_layer, fmt::format("model.first_dense ({}) leaves no block of model.n_layer ({}) a "
                                                 "mixture of experts",
                                                 m.first_dense, m.n_layer));
  c.check(m.router == "softmax" || m.router == "sigmoid",
          fmt::format("model.router: {} (expected \"softmax\" or \"sigmoid\")", quote(m.router)));
  c.check(m.aux_loss_coeff >= 0, fmt::format("model.aux_loss_coeff ({}) must be >= 0", m.aux_loss_coeff));
  c.check(m.z_loss_coeff >= 0, fmt::format("model.z_loss_coeff ({}) must be >= 0", m.z_loss_coeff));
  c.check(m.router_bias_rate >= 0, fmt::format("model.router_bias_rate ({}) must be >= 0", m.router_bias_rate));
  c.check(m.capacity_factor >= 0,
          fmt::format("model.capacity_factor ({}) must be >= 0 (0: dropless)", m.capacity_factor));
}

void check_model(const Checker& c, const ModelConfig& m) {
  c.check(find_model_family(m.arch) != nullptr,
          fmt::format("model.arch: unsupported architecture {} (expected {})", quote(m.arch), model_family_names()));
  c.at_least("model.n_layer", m.n_layer, 1);
  c.at_least("model.n_head", m.n_head, 1);
  c.at_least("model.d_model", m.d_model, 1);
  c.at_least("model.vocab_size", m.vocab_size, 1);
  c.at_least("model.max_seq_len", m.max_seq_len, 1);
  c.check(m.d_model % m.n_head == 0,
          fmt::format("model.d_model ({}) must be divisible by model.n_head ({})", m.d_model, m.n_head));
  if (m.family().grouped_kv) {  // Llama's keys
    c.at_least("model.n_kv_head", m.n_kv_head, 0);
    c.at_least("model.ffn_hidden", m.ffn_hidden, 0);
    c.at_least("model.multiple_of", m.multiple_of, 1);
    c.check(m.n_head % m.kv_heads() == 0,
            fmt::format("model.n_kv_head ({}) must divide model.n_head ({}): each key/value head serves whole "
                        "query heads",
                        m.kv_heads(), m.n_head));
    c.check((m.d_model / m.n_head) % 2 == 0,
            fmt::format("model.d_model / model.n_head = {} must be even (rotary embeddings turn channel pairs)",
                        m.d_model / m.n_head));
    c.check(m.norm_eps > 0, fmt::format("model.norm_eps ({}) must be > 0", m.norm_eps));
    c.check(m.rope_theta > 1, fmt::format("model.rope_theta ({}) must be > 1", m.rope_theta));
  }
  check_experts(c, m);
}

// parallel.shard and its companions: a level the grid can take, a group dividing the replicas.
void check_shard(const Checker& c, const Config& cfg) {
  const auto& p = cfg.parallel;
  c.check(p.shard == "none" || p.shard == "optimizer" || p.shard == "gradients" || p.shard == "weights",
          fmt::format("parallel.shard: unknown level {} (expected \"none\", \"optimizer\", \"gradients\" or "
                      "\"weights\")",
                      quote(p.shard)));
  c.check(
      p.shard_reuse == "regather" || p.shard_reuse == "keep",
      fmt::format("parallel.shard_reuse: unknown policy {} (expected \"regather\" or \"keep\")", quote(p.shard_reuse)));
  c.at_least("parallel.shard_prefetch", p.shard_prefetch, 0);
  c.at_least("parallel.shard_group", p.shard_group, 0);
  const ShardLevel level = shard_level(p);
  const int replicas = p.replicas();
  if (level >= ShardLevel::Gradients)
    c.check(replicas > 1, fmt::format("parallel.shard = {} needs more than one replica to shard over (parallel.dp x "
                                      "parallel.cp = {})",
                                      quote(p.shard), replicas));
  if (p.shard_group > 0) {
    c.check(replicas % p.shard_group == 0,
            fmt::format("parallel.shard_group ({}) must divide the replicas (parallel.dp x parallel.cp = {})",
                        p.shard_group, replicas));
    c.check(level >= ShardLevel::Gradients || p.shard_group == replicas,
            fmt::format("parallel.shard_group ({}) applies to parallel.shard = \"gradients\" and \"weights\"; "
                        "parallel.shard is {}",
                        p.shard_group, quote(to_string(level))));
  }
}

void check_parallel(const Checker& c, const Config& cfg) {
  const auto& m = cfg.model;
  const auto& p = cfg.parallel;
  c.at_least("parallel.virtual_stages", p.virtual_stages, 1);
  c.check(p.dp_bucket_mb > 0, fmt::format("parallel.dp_bucket_mb ({}) must be > 0", format_double(p.dp_bucket_mb)));
  check_shard(c, cfg);
  c.rule(grid_problem(cfg));
  const int64_t stages = int64_t{p.pp} * p.virtual_stages;
  if (!p.layers_per_stage.empty()) {
    c.check(static_cast<int64_t>(p.layers_per_stage.size()) == stages,
            fmt::format("parallel.layers_per_stage has {} entries, expected parallel.pp * "
                        "parallel.virtual_stages = {}",
                        p.layers_per_stage.size(), stages));
    double sum = 0;
    for (size_t i = 0; i < p.layers_per_stage.size(); ++i) {
      const double n = p.layers_per_stage[i];
      const bool end = i == 0 || i + 1 == p.layers_per_stage.size();
      c.check(2 * n == std::floor(2 * n),
              fmt::format("parallel.layers_per_stage[{}] ({}) must be a whole or half number of blocks (x.5 splits a "
                          "block between its attention and its MLP)",
                          i, n));
      c.check(n >= (end ? 0 : 0.5),
              fmt::format("parallel.layers_per_stage[{}] ({}) must be {}", i, n,
                          end ? ">= 0" : ">= 0.5 (only the first and last stage may hold no block)"));
      sum += n;
    }
    c.check(sum == m.n_layer,
            fmt::format("parallel.layers_per_stage sums to {}, expected model.n_layer = {}", sum, m.n_layer));
  }
  for (size_t i = 0; i < p.recompute_stages.size(); ++i)
    c.check(p.recompute_stages[i] >= 0 && p.recompute_stages[i] < stages,
            fmt::format("parallel.recompute_stages[{}] ({}) is not a stage: stages are 0..{}", i, p.recompute_stages[i],
                        stages - 1));
  c.check(cfg.schedule.placement == "loop" || cfg.schedule.placement == "v" ||
              cfg.schedule.placement.find_first_not_of("0123456789, ") == std::string::npos,
          fmt::format("schedule.placement: {} is not \"loop\", \"v\" or a list of ranks like \"0,1,1,0\"",
                      quote(cfg.schedule.placement)));
  c.check(!cfg.schedule.name.empty() || !cfg.schedule.file.empty(),
          "schedule.name: must not be empty (or set schedule.file)");
}

void check_train(const Checker& c, const Config& cfg) {
  const auto& m = cfg.model;
  const auto& p = cfg.parallel;
  const auto& t = cfg.train;
  c.at_least("train.steps", t.steps, 0);
  c.at_least("train.global_batch", t.global_batch, 1);
  c.at_least("train.microbatches", t.microbatches, 1);
  c.rule(batch_split_problem(t.global_batch, p.dp, t.microbatches));
  c.check(t.seq_len >= 1 && t.seq_len <= m.max_seq_len,
          fmt::format("train.seq_len ({}) must be between 1 and model.max_seq_len ({})", t.seq_len, m.max_seq_len));
  c.check(t.lr > 0, fmt::format("train.lr ({}) must be > 0", t.lr));
  c.check(t.recompute == "none" || t.recompute == "selective" || t.recompute == "full",
          fmt::format("train.recompute: unknown mode {} (expected \"none\", \"selective\" or \"full\")",
                      quote(t.recompute)));
  c.check(t.precision == "fp32" || t.precision == "bf16",
          fmt::format("train.precision: unknown precision {} (expected \"fp32\" or \"bf16\")", quote(t.precision)));
  c.check(t.lr_schedule == "constant" || t.lr_schedule == "cosine",
          fmt::format("train.lr_schedule: unknown schedule {} (expected \"constant\" or \"cosine\")",
                      quote(t.lr_schedule)));
  c.at_least("train.warmup_steps", t.warmup_steps, 0);
  c.check(t.min_lr >= 0 && t.min_lr <= t.lr,
          fmt::format("train.min_lr ({}) must be between 0 and train.lr ({})", t.min_lr, t.lr));
  c.check(t.beta1 >= 0 && t.beta1 < 1, fmt::format("train.beta1 ({}) must be in [0, 1)", t.beta1));
  c.check(t.beta2 >= 0 && t.beta2 < 1, fmt::format("train.beta2 ({}) must be in [0, 1)", t.beta2));
  c.check(t.eps > 0, fmt::format("train.eps ({}) must be > 0", t.eps));
  c.check(t.weight_decay >= 0, fmt::format("train.weight_decay ({}) must be >= 0", t.weight_decay));
  c.check(t.grad_clip >= 0, fmt::format("train.grad_clip ({}) must be >= 0 (0 = off)", t.grad_clip));
}

void check_data(const Checker& c, const Config& cfg) {
  const auto& t = cfg.train;
  c.at_least("train.eval_every", t.eval_every, 0);
  c.at_least("train.eval_batches", t.eval_batches, 1);
  const auto& d = cfg.data;
  c.check(t.eval_every == 0 || !d.val.empty(), "train.eval_every is set but data.val names no validation dataset");
  c.check(!d.train.empty(), "data.train: no training dataset given");
  c.check(d.train_weights.empty() || d.train_weights.size() == d.train.size(), "data.train: one weight per source");
  for (size_t i = 0; i < d.train_weights.size(); ++i)
    c.check(d.train_weights[i] > 0 && std::isfinite(d.train_weights[i]),
            fmt::format("data.train[{}].weight ({}): blend weights must be positive", i,
                        format_double(d.train_weights[i])));
  for (const auto* list : {&d.train, &d.val})
    for (size_t i = 0; i < list->size(); ++i)
      c.check(!(*list)[i].empty(), fmt::format("data.{}[{}]: empty file name", list == &d.train ? "train" : "val", i));
  c.check(d.sampling == "sequential" || d.sampling == "shuffle",
          fmt::format("data.sampling: unknown mode {} (expected \"sequential\" or \"shuffle\")", quote(d.sampling)));
}

void check_runtime(const Checker& c, const Config& cfg) {
  c.at_least("checkpoint.every", cfg.checkpoint.every, 0);
  c.at_least("checkpoint.keep", cfg.checkpoint.keep, 1);
  c.at_least("log.every", cfg.log.every, 1);
  c.check(cfg.runtime.device == "cpu" || cfg.runtime.device == "cuda",
          fmt::format("runtime.device: unknown device {} (expected \"cpu\" or \"cuda\")", quote(cfg.runtime.device)));
  c.check(cfg.comm.p2p == "auto" || cfg.comm.p2p == "nccl" || cfg.comm.p2p == "mpi",
          fmt::format("comm.p2p: unknown transport {} (expected \"auto\", \"nccl\" or \"mpi\")", quote(cfg.comm.p2p)));
  c.check(cfg.comm.p2p != "nccl" || cfg.runtime.device == "cuda",
          "comm.p2p = \"nccl\" needs runtime.device = \"cuda\" (CPU runs move host memory with MPI)");
  c.check(cfg.runtime.timeout_s >= 0,
          fmt::format("runtime.timeout_s ({}) must be >= 0 (0 = no watchdog)", cfg.runtime.timeout_s));
  c.check(cfg.runtime.dense_products == "auto" || cfg.runtime.dense_products == "blas" ||
              cfg.runtime.dense_products == "onednn",
          fmt::format("runtime.dense_products: unknown library {} (expected \"auto\", \"blas\" or \"onednn\")",
                      quote(cfg.runtime.dense_products)));
  c.check(cfg.runtime.on_nonfinite == "stop" || cfg.runtime.on_nonfinite == "skip",
          fmt::format("runtime.on_nonfinite: unknown action {} (expected \"stop\" or \"skip\")",
                      quote(cfg.runtime.on_nonfinite)));
  c.check(cfg.log.peak_flops >= 0, fmt::format("log.peak_flops ({}) must be >= 0 (0 = unknown)", cfg.log.peak_flops));
}

}  // namespace

void validate_config(const Config& cfg) {
  const Checker c{prefix(cfg.source)};
  check_numbers_finite(c, cfg);
  check_model(c, cfg.model);
  check_parallel(c, cfg);
  check_train(c, cfg);
  check_data(c, cfg);
  check_runtime(c, cfg);
}

}  // namespace pipetrain
