// The run configuration's key table (every key once: section, name, field) and the
// small formatting helpers that parsing, validation and to_toml share. Internal to
// src/core: the public interface is pipetrain/core/config.hpp.
#pragma once

#include <fmt/format.h>

#include <array>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "pipetrain/core/config.hpp"

namespace pipetrain::config_keys {

using Ref = std::variant<int*, uint64_t*, double*, bool*, Toggle*, std::string*, std::vector<std::string>*,
                         std::vector<int>*, std::vector<double>*, DataConfig*>;  // DataConfig*: data.train (paths, or a blend)

struct KeyDesc {
  std::string_view section, name;
  Ref (*ref)(Config&);
  std::string full() const { return fmt::format("{}.{}", section, name); }
};

#define PT_KEY(sec, field) \
  KeyDesc { #sec, #field, [](Config& c) -> Ref { return &c.sec.field; } }
inline constexpr std::array kKeys{
    PT_KEY(model, arch),
    PT_KEY(model, n_layer),
    PT_KEY(model, n_head),
    PT_KEY(model, d_model),
    PT_KEY(model, vocab_size),
    PT_KEY(model, max_seq_len),
    PT_KEY(model, n_kv_head),
    PT_KEY(model, ffn_hidden),
    PT_KEY(model, multiple_of),
    PT_KEY(model, norm_eps),
    PT_KEY(model, rope_theta),
    PT_KEY(model, tie_embeddings),
    PT_KEY(model, n_experts),
    PT_KEY(model, top_k),
    PT_KEY(model, expert_ffn_hidden),
    PT_KEY(model, n_shared_experts),
    PT_KEY(model, moe_every),
    PT_KEY(model, first_dense),
    PT_KEY(model, router),
    PT_KEY(model, router_renormalize),
    PT_KEY(model, aux_loss_coeff),
    PT_KEY(model, z_loss_coeff),
    PT_KEY(model, router_bias_rate),
    PT_KEY(model, capacity_factor),
    PT_KEY(model, router_force_balance),
    PT_KEY(parallel, dp),
    PT_KEY(parallel, pp),
    PT_KEY(parallel, tp),
    PT_KEY(parallel, virtual_stages),
    PT_KEY(parallel, layers_per_stage),
    PT_KEY(parallel, zero1),
    PT_KEY(parallel, shard),
    PT_KEY(parallel, shard_group),
    PT_KEY(parallel, shard_reuse),
    PT_KEY(parallel, shard_prefetch),
    PT_KEY(parallel, ep),
    PT_KEY(parallel, recompute_stages),
    PT_KEY(parallel, dp_bucket_mb),
    PT_KEY(parallel, vocab_parallel),
    PT_KEY(parallel, sequence_parallel),
    PT_KEY(parallel, cp),
    PT_KEY(train, recompute),
    PT_KEY(schedule, name),
    PT_KEY(schedule, file),
    PT_KEY(schedule, placement),
    PT_KEY(schedule, overlap),
    PT_KEY(train, steps),
    PT_KEY(train, global_batch),
    PT_KEY(train, microbatches),
    PT_KEY(train, seq_len),
    PT_KEY(train, lr),
    PT_KEY(train, lr_schedule),
    PT_KEY(train, warmup_steps),
    PT_KEY(train, min_lr),
    PT_KEY(train, beta1),
    PT_KEY(train, beta2),
    PT_KEY(train, eps),
    PT_KEY(train, weight_decay),
    PT_KEY(train, decay_2d_only),
    PT_KEY(train, grad_clip),
    PT_KEY(train, seed),
    PT_KEY(train, eval_every),
    PT_KEY(train, eval_batches),
    PT_KEY(train, precision),
    KeyDesc{"data", "train", [](Config& c) -> Ref { return &c.data; }},
    PT_KEY(data, val),
    PT_KEY(data, sampling),
    PT_KEY(data, respect_documents),
    PT_KEY(data, pack_documents),
    PT_KEY(checkpoint, dir),
    PT_KEY(checkpoint, every),
    PT_KEY(checkpoint, keep),
    PT_KEY(log, every),
    PT_KEY(log, metrics),
    PT_KEY(log, file),
    PT_KEY(log, dir),
    PT_KEY(log, peak_flops),
    PT_KEY(log, progress),
    PT_KEY(runtime, device),
    PT_KEY(runtime, timeout_s),
    PT_KEY(runtime, on_nonfinite),
    PT_KEY(runtime, pack_weights),
    PT_KEY(runtime, dense_products),
    PT_KEY(comm, p2p),
    PT_KEY(comm, progress_us),
};
#undef PT_KEY

// The word an integer-list key takes for its empty value: parallel.layers_per_stage =
// "auto" (balanced by cost), parallel.recompute_stages = "all".
std::string list_word(std::string_view key);
const KeyDesc* find_key(std::string_view section, std::string_view name);
bool is_section(std::string_view s);
// "file: " (or nothing when the config has no source).
std::string prefix(const std::string& source);
// A TOML basic string literal: quoted, with escapes, always on one line.
std::string quote(std::string_view s);
// A double as a TOML float that parses back to exactly the same value.
std::string format_double(double v);

}  // namespace pipetrain::config_keys
