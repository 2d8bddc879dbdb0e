// The planner's cost model (pipetrain/plan/cost_model.hpp); docs/cost-model.md has the
// formulas with their reasons.
#include "pipetrain/plan/cost_model.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace pipetrain {

bool is_block_part(UnitKind kind) {
  return kind == UnitKind::Block || kind == UnitKind::Attention || kind == UnitKind::Mlp;
}

namespace {

// Weights a block's attention and MLP halves multiply by (per token, forward: 2 FLOPs each).
double attention_matmul_params(const ModelConfig& m) {
  const double C = m.d_model;
  if (m.family().grouped_kv) return C * (m.n_head + 2.0 * m.kv_heads()) * (C / m.n_head) + C * C;
  return 4.0 * C * C;
}
double mlp_matmul_params(const ModelConfig& m) {
  const double C = m.d_model;
  return m.family().gated_mlp ? 3.0 * C * m.ffn() : 8.0 * C * C;
}
// A mixture of experts' MLP: the shared experts' matrices (tp splits them), the norm and
// the router (whole on every rank), and the routed experts' (which ep and tp split).
UnitParams moe_params(const ModelConfig& m) {
  const double C = m.d_model;
  return {3.0 * C * m.expert_ffn() * m.n_shared_experts, C + C * m.n_experts, 3.0 * C * m.expert_ffn() * m.n_experts};
}

// The matrices one token passes through in a mixture of experts' MLP: its top_k routed
// experts, the shared ones, the router.
double active_expert_params(const ModelConfig& m) {
  const double C = m.d_model;
  return 3.0 * C * m.expert_ffn() * (m.top_k + m.n_shared_experts) + C * m.n_experts;
}

}  // namespace

UnitWork unit_work(const ModelConfig& model, UnitKind kind, int tp, int B, int T, int storage_bytes, int block,
                   int context) {
  const double N = static_cast<double>(B) * T, C = model.d_model, V = model.padded_vocab();
  UnitWork w;
  switch (kind) {
    case UnitKind::Embedding:
      // forward: read the rows, write the output (GPT-2 also reads and adds the positions);
      // backward: read the gradient, read and write the rows it adds into.
      w.bytes = 4.0 * N * C * ((model.family().learned_positions ? 4 : 2) + 3);
      w.allreduces_f = tp > 1 ? 1 : 0;  // vocab-parallel: the partial lookups are summed
      break;
    case UnitKind::Block: {
      const UnitWork a = unit_work(model, UnitKind::Attention, tp, B, T, storage_bytes, -1, context),
                     m = unit_work(model, UnitKind::Mlp, tp, B, T, storage_bytes, block);
      w.f_flops = a.f_flops + m.f_flops;
      w.i_flops = a.i_flops + m.i_flops;
      w.w_flops = a.w_flops + m.w_flops;
      w.attention_flops = a.attention_flops;
      w.bytes = a.bytes + m.bytes;
      w.allreduces_f = a.allreduces_f + m.allreduces_f;
      w.allreduces_i = a.allreduces_i + m.allreduces_i;
      break;
    }
    case UnitKind::Attention:
    case UnitKind::Mlp: {
      const bool attention = kind == UnitKind::Attention, experts = !attention && block >= 0 && model.moe(block);
      const double P = attention ? attention_matmul_params(model)
                       : experts ? active_expert_params(model)
                                 : mlp_matmul_params(model);
      // Attention over a causal window: QK^T and PV, each 2 T C FLOPs per token halved.
      const bool ring = context > 0 && context != T;
      const double attn = attention ? 2.0 * N * (ring ? context : T) * C / tp : 0.0;
      w.attention_flops = attn;
      w.f_flops = 2.0 * N * P / tp + attn;
      w.i_flops = 2.0 * N * P / tp + (ring ? 2.5 : 2.0) * attn;
      w.w_flops = 2.0 * N * P / tp;
      w.allreduces_f = w.allreduces_i = tp > 1 ? 1 : 0;  // after the row-parallel product
      // Elementwise traffic per token, forward + backward: a norm and a residual add on the
      // whole width (15 C, not sharded), attention's reshapes (14 C / tp) or the activation
      // function (24 C / tp) on the shard; flash attention keeps no T x T scores.
      w.bytes = N * storage_bytes * (15.0 * C + (attention ? 14.0 : 24.0) * C / tp);
      if (experts) w.bytes += 4.0 * N * model.top_k * C * 4.0;  // rows gathered, combined; both again backward
      break;
    }
    case UnitKind::Head:
      w.f_flops = w.i_flops = w.w_flops = 2.0 * N * V * C / tp;
      w.bytes = 3.0 * 4.0 * N * V / tp;     // logits written, read by the softmax, gradient written
      w.allreduces_i = tp > 1 ? 1 : 0;      // the input gradient of the column-parallel product
      w.small_reductions_f = tp > 1 ? 3 : 0;  // the loss's max, sum and target logit
      break;
  }
  return w;
}

UnitParams unit_params(const ModelConfig& model, UnitKind kind, int block) {
  const double C = model.d_model, V = model.padded_vocab();
  const bool llama = model.family().blocks == BlockKind::Llama;
  switch (kind) {
    case UnitKind::Embedding:
      return {V * C, model.family().learned_positions ? static_cast<double>(model.max_seq_len) * C : 0.0};
    case UnitKind::Block: {
      const UnitParams a = unit_params(model, UnitKind::Attention), m = unit_params(model, UnitKind::Mlp, block);
      return {a.sharded + m.sharded, a.replicated + m.replicated, m.experts};
    }
    // Shards: qkv or fc with its bias, the projection's weight; replicated: the LayerNorm,
    // the projection's bias (Llama: the matrices; the RMSNorm).
    case UnitKind::Attention:
      return llama ? UnitParams{attention_matmul_params(model), C} : UnitParams{4 * C * C + 3 * C, 3 * C};
    case UnitKind::Mlp:
      if (block >= 0 && model.moe(block)) return moe_params(model);
      return llama ? UnitParams{mlp_matmul_params(model), C} : UnitParams{8 * C * C + 4 * C, 3 * C};
    case UnitKind::Head:
      return {V * C, llama ? C : 2 * C};
  }
  return {};
}

double model_params(const ModelConfig& model) {
  const UnitParams head = unit_params(model, UnitKind::Head);
  double blocks = 0;
  for (int b = 0; b < model.n_layer; ++b) blocks += unit_params(model, UnitKind::Block, b).on_rank(1);
  return unit_params(model, UnitKind::Embedding).on_rank(1) + blocks + head.on_rank(1) -
         (model.tied() ? head.sharded : 0.0);
}

double widened_params(const ModelConfig& model, UnitKind kind, int tp, bool native_bf16_products, int block) {
  const double C = model.d_model;
  const bool llama = model.family().blocks == BlockKind::Llama;
  if (!native_bf16_products) return unit_params(model, kind, block).on_rank(tp);
  // Experts' products are f32 products on every backend (Parameter::f32_products); GPUs run
  // no expert parallelism yet, so a rank holds every expert's tp share.
  if ((kind == UnitKind::Block || kind == UnitKind::Mlp) && block >= 0 && model.moe(block)) {
    const double attention = kind == UnitKind::Block ? widened_params(model, UnitKind::Attention, tp, true) : 0.0;
    return attention + unit_params(model, UnitKind::Mlp, block).on_rank(tp);
  }
  switch (kind) {
    case UnitKind::Embedding:
      return 0.0;  // tables only
    case UnitKind::Block:
      return llama ? 2 * C : 7 * C / tp + 6 * C;  // GPT-2: qkv and fc biases sharded
    case UnitKind::Attention:
      return llama ? C : 3 * C / tp + 3 * C;
    case UnitKind::Mlp:
      return llama ? C : 4 * C / tp + 3 * C;
    case UnitKind::Head:
      return llama ? C : 2 * C;  // the final norm
  }
  return 0.0;
}

double dense_weight_params(const ModelConfig& model, UnitKind kind, int tp, int block) {
  const bool experts = block >= 0 && model.moe(block);  // one plain product per expert: nothing packed
  switch (kind) {
    case UnitKind::Embedding:
      return 0.0;  // a lookup, no product
    case UnitKind::Block:
      return (attention_matmul_params(model) + (experts ? 0.0 : mlp_matmul_params(model))) / tp;
    case UnitKind::Attention:
      return attention_matmul_params(model) / tp;
    case UnitKind::Mlp:
      return experts ? 0.0 : mlp_matmul_params(model) / tp;
    case UnitKind::Head:
      return static_cast<double>(model.padded_vocab()) * model.d_model / tp;  // the logits' columns on this rank
  }
  return 0.0;
}

double rank_dense_weight_params(const ModelConfig& model, const std::vector<StagePiece>& pieces, int tp,
                                int vocab_slices) {
  double n = 0;
  for (const StagePiece& p : pieces)
    if (vocab_slices == 0 || p.kind != UnitKind::Head) n += dense_weight_params(model, p.kind, tp, p.block);
  if (vocab_slices > 0) n += static_cast<double>(model.padded_vocab()) * model.d_model / vocab_slices;
  return n;
}

bool multiplies_bf16(const DeviceSpec& device) {
  if (device.kind == "cuda") return true;
  auto rate = [&](const std::string& precision) {
    const auto p = device.peak_flops.find(precision);
    return p == device.peak_flops.end() ? 0.0 : p->second;
  };
  return rate("bf16") > rate("fp32");
}

PackChoice choose_pack_weights(const PackInputs& in) {
  auto gib = [](double b) { return b >= 1073741824.0 ? fmt::format("{:.1f} GiB", b / 1073741824.0)
                                                     : fmt::format("{:.0f} MiB", b / 1048576.0); };
  if (!in.can_pack) return {false, "the backend multiplies by the weights in place"};
  if (!in.f32_products) return {false, "bf16 products read the bf16 weights"};
  if (in.measured_pays) {
    if (!*in.measured_pays) return {false, "timed not to pay here"};
  } else if (in.d_model < kPackModelMin) {
    return {false, fmt::format("d_model {} < {}: not measured to pay", in.d_model, kPackModelMin)};
  } else if (in.rows > kPackRowsMax) {
    return {false, fmt::format("{}-row microbatches: sgemm's repacking weighs little above {}", in.rows, kPackRowsMax)};
  } else if (in.microbatches < 2) {
    return {false, "fewer than 2 microbatches a step: the reorders would not pay back"};
  }
  if (in.memory_per_rank > 0 && in.copies_bytes > 0.25 * in.memory_per_rank)
    return {false, fmt::format("the copies ({}) would take over a quarter of the rank's {}", gib(in.copies_bytes),
                               gib(in.memory_per_rank))};
  std::string why = in.measured_pays ? fmt::format("timed to pay; copies {}", gib(in.copies_bytes))
                                     : fmt::format("{}-row microbatches; copies {}", in.rows, gib(in.copies_bytes));
  if (in.memory_per_rank > 0)
    why += fmt::format(", {:.1f}% of the rank's {}", 100 * in.copies_bytes / in.memory_per_rank, gib(in.memory_per_rank));
  return {true, why};
}

double allreduce_seconds(double bytes, int ranks, const LinkSpec& link) {
  if (ranks <= 1) return 0;
  const double n = ranks;
  return 2 * (n - 1) * link.latency + 2 * (n - 1) / n * bytes / link.ring_bandwidth();
}

double allgather_seconds(double bytes, int ranks, const LinkSpec& link) {
  if (ranks <= 1) return 0;
  const double n = ranks;
  return (n - 1) * link.latency + (n - 1) / n * bytes / link.bandwidth;
}

double p2p_seconds(double bytes, const LinkSpec& link) { return link.latency + bytes / link.bandwidth; }

double expert_exchange_seconds(const ClusterSpec& c, const ModelConfig& model, int tp, int ep, int B, int T) {
  if (ep <= 1) return 0;
  const LinkSpec& link = group_link(c, tp, ep);
  // An all-to-all of `bytes` held per rank moves what an all-gather of that whole does:
  // (n - 1)/n of it leaves each rank, in n - 1 messages.
  const double rows = 4.0 * B * T * model.top_k * model.d_model;
  return allgather_seconds(4.0 * ep, ep, link) + 2.0 * allgather_seconds(rows, ep, link);
}

const LinkSpec& group_link(const ClusterSpec& c, int stride, int size) {
  return static_cast<int64_t>(stride) * size <= c.devices_per_node ? c.intra_node : c.inter_node;
}

namespace {
// The FLOP rate of a block part's products on `tokens` rows at full width: measured where
// the cluster file has rates for the precision (they include the elementwise work), else the
// peak times the file's efficiency.
double block_rate(const DeviceSpec& d, const std::string& precision, double tokens, bool packed) {
  if (const auto measured = d.measured.find(precision); measured != d.measured.end())
    return measured->second.block_at(tokens, packed);
  const auto peak = d.peak_flops.find(precision);
  return peak == d.peak_flops.end() ? 0 : peak->second * d.gemm_efficiency;
}
}  // namespace

ActionTimes unit_times(const ClusterSpec& c, const ModelConfig& model, UnitKind kind, int tp, int B, int T,
                       const std::string& precision, Recompute mode, int block, int context, bool packed) {
  const bool experts = block >= 0 && model.moe(block);
  if (kind == UnitKind::Block && experts) {  // each half at its own rate
    const ActionTimes a = unit_times(c, model, UnitKind::Attention, tp, B, T, precision, mode, -1, context, packed),
                      m = unit_times(c, model, UnitKind::Mlp, tp, B, T, precision, mode, block, 0, packed);
    return {a.F + m.F, a.I + m.I, a.W + m.W, a.tp_comm + m.tp_comm};
  }
  const UnitWork w = unit_work(model, kind, tp, B, T, precision == "bf16" ? 2 : 4, block, context);
  const DeviceSpec& d = c.device;
  const auto measured = d.measured.find(precision);
  const auto peak = d.peak_flops.find(precision);
  const double flop_rate = peak == d.peak_flops.end() ? 0 : peak->second * d.gemm_efficiency;
  double rate = flop_rate, byte_rate = d.memory_bandwidth;
  bool bytes_counted = true;
  if (measured != d.measured.end()) {  // measured rates already include the unit's elementwise work
    // A tp shard's products are 1/tp as wide: about the work of N/tp tokens at full width;
    // an expert's, of its share of the routed rows.
    const double tokens = static_cast<double>(B) * T / tp * (experts ? double(model.top_k) / model.n_experts : 1.0);
    // (A mixture's experts multiply in place: never packed.)
    if (is_block_part(kind)) rate = block_rate(d, precision, tokens, packed && !experts), bytes_counted = false;
    if (kind == UnitKind::Head) rate = measured->second.head_at(tokens, packed), bytes_counted = false;
    if (kind == UnitKind::Embedding) byte_rate = measured->second.embedding_bytes_per_s;
  }
  const double flops_total = w.f_flops + w.i_flops + w.w_flops;
  auto compute = [&](double flops) {
    double s = rate > 0 ? flops / rate : 0;
    if (bytes_counted && w.bytes > 0)  // memory-bound work, spread over the actions like the FLOPs
      s += (flops_total > 0 ? flops / flops_total : 0.5) * w.bytes / byte_rate;
    return s + d.layer_overhead_s;
  };
  ActionTimes t;
  const double N = static_cast<double>(B) * T;
  const LinkSpec& link = group_link(c, 1, tp);
  const double activation = allreduce_seconds(4.0 * N * model.d_model, tp, link);  // reductions are f32
  const double comm_f = w.allreduces_f * activation + w.small_reductions_f * allreduce_seconds(4.0 * N, tp, link);
  const double comm_i = w.allreduces_i * activation;
  if (kind == UnitKind::Embedding) {  // no FLOPs: its bytes split 4 : 3 between forward and backward
    const double reads = model.family().learned_positions ? 4.0 : 2.0;  // the positions' table too
    const double fwd = w.bytes * reads / (reads + 3.0);
    t.F = fwd / byte_rate + d.layer_overhead_s;
    t.I = 0;
    t.W = (w.bytes - fwd) / byte_rate + d.layer_overhead_s;
  } else {
    t.F = compute(w.f_flops);
    t.I = compute(w.i_flops);
    t.W = compute(w.w_flops);
  }
  t.F += comm_f;
  t.I += comm_i;
  t.tp_comm = comm_f + comm_i;
  if (is_block_part(kind)) {
    if (mode == Recompute::Full) {  // the forward again, collectives included, before backward_input
      t.I += t.F;
      t.tp_comm += comm_f;
    } else if (mode == Recompute::Selective) {
      t.I += rate > 0 ? w.attention_flops / rate : 0;
    }
  }
  return t;
}

ActionTimes ring_seconds(const ClusterSpec& c, const ModelConfig& model, int tp, int cp, int B, int context,
                         const std::string& precision) {
  if (cp <= 1) return {};
  const int rows = context / cp;  // a rank's tokens of each sequence
  const double keys_values = 4.0 * 2.0 * B * rows * model.kv_heads() * (model.d_model / model.n_head) / tp;
  const double step = p2p_seconds(keys_values, group_link(c, tp, cp));
  // One step's block: a cp-th of the rank's attention products (its share of the window).
  const double rate = block_rate(c.device, precision, static_cast<double>(B) * rows / tp, false);
  const UnitWork w = unit_work(model, UnitKind::Attention, tp, B, rows, 4, -1, context);
  const double block_f = rate > 0 ? w.attention_flops / cp / rate : 0, block_i = 2.5 * block_f;
  ActionTimes t;
  t.F = (cp - 1) * std::max(0.0, step - block_f);
  t.I = (cp - 1) * std::max(0.0, 2.0 * step - block_i) + step;  // the gradients' last hop home waits
  return t;
}

double adamw_seconds(double params, const DeviceSpec& d) { return 28.0 * params / d.memory_bandwidth; }

double gradient_passes_seconds(double params, const DeviceSpec& d) { return 8.0 * params / d.memory_bandwidth; }

double zero1_share(double params, double experts, int dp, int ep) {
  return (params - experts) / dp + experts * ep / dp;
}

RankMemory rank_memory(const MemoryInputs& in) {
  RankMemory m;
  m.weights = 4.0 * in.params;
  m.gradients = 4.0 * in.params;
  m.optimizer =
      8.0 * (in.zero1 && in.dp > 1 ? zero1_share(in.params, in.experts, in.dp, in.ep) : in.params - in.not_updated);
  m.compute_copy = in.bf16 ? 2.0 * in.params + 4.0 * in.widened : 0.0;  // bf16-rounded weights, some widened too
  m.packed_copies = 2.0 * 4.0 * in.packed;                                // two f32 copies (blocked layouts pad little)
  m.activations =
      std::max(in.largest_stash * in.peak_inflight + in.recompute, in.stash_peak) + in.vocab_stash * in.vocab_inflight;
  m.buffers = in.activation_bytes * in.receive_buffers + in.vocab_buffers;
  if (in.shard >= ShardLevel::Gradients && in.dp > 1) {  // a part each, and what the program holds whole
    const double part = (in.params - in.experts) / in.spans.dense + in.experts / in.spans.experts;
    // What is whole at once: the program's joint most where it is known.
    const double together = in.whole_together > 0 ? in.whole_together : in.whole_weights + in.whole_gradients;
    const double weights = in.shard == ShardLevel::Weights ? std::min(in.whole_weights, together) : 0.0;
    m.gradients = 4.0 * (part + std::min(in.whole_gradients, together - weights));
    m.optimizer = 8.0 * part;
    if (in.shard == ShardLevel::Weights) {
      // bf16: gathered as bf16 (no whole f32 values), widened where kernels read f32, and
      // each part rounded too.
      const double wide = in.params > 0 ? in.widened / in.params : 0.0;
      m.weights = in.bf16 ? 4.0 * part : 4.0 * (part + weights);
      if (in.bf16) m.compute_copy = 2.0 * part + (2.0 + 4.0 * wide) * weights;
    }
    // A reduce-scatter's scratch is twice its message (libnbc's), until it completes; across
    // hybrid groups the parts' all-reduce takes the parts' size once more.
    if (in.reduction_scratch) m.buffers += 8.0 * in.in_flight + (in.spans.dense < in.dp ? 4.0 * part : 0.0);
    return m;
  }
  if (in.reduction_scratch) {  // each gradient's reduction over its group of d ranks in flight at once
    const auto times = [&](int d) { return d <= 1 ? 0.0 : in.zero1 ? (2.0 * d - 1.0) / d : 1.0; };
    m.buffers += 4.0 * ((in.params - in.experts) * times(in.dp) + in.experts * times(in.expert_dp));
  }
  return m;
}

}  // namespace pipetrain
