// Run configuration: the typed contents of a TOML config file plus
// `--set section.key=value` overrides. Parsing lives in src/core/config.cpp, the key
// table in config_keys.hpp, validation in config_validate.cpp; every error names the
// offending key.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "pipetrain/core/grid_shape.hpp"
#include "pipetrain/core/model_family.hpp"

namespace pipetrain {

// A key that is on, off, or decided by pipetrain for the run at hand (TOML: true, false
// or "auto").
enum class Toggle { Off, On, Auto };

struct ModelConfig {
  std::string arch = "gpt2";  // a family of core/model_family.hpp: gpt2 | llama
  int n_layer = 12;
  int n_head = 12;
  int d_model = 768;
  int vocab_size = 50257;  // real vocabulary; padded_vocab() rounds up to 128
  int max_seq_len = 1024;
  // Llama only (GPT-2 ignores them):
  int n_kv_head = 0;           // key/value heads (grouped-query attention); 0 = n_head
  int ffn_hidden = 0;          // SwiGLU width; 0 = Llama's rule (ffn())
  int multiple_of = 256;       // the rule rounds up to a multiple of this
  double norm_eps = 1e-5;      // RMSNorm epsilon
  double rope_theta = 500000;  // rotary base (Llama 3; Llama 2 used 10000)
  bool tie_embeddings = false; // the LM head reuses the token embedding (GPT-2 always does)
  // Mixture of experts (Llama only; model/moe_mlp.hpp): the MLP of block i is n_experts
  // SwiGLU experts, each token through its top_k, when n_experts > 0, i >= first_dense and
  // (i - first_dense) is a multiple of moe_every.
  int n_experts = 0;
  int top_k = 2;
  int expert_ffn_hidden = 0;  // each expert's SwiGLU width; 0 = ffn()
  int n_shared_experts = 0;   // always-on experts (DeepSeek): one SwiGLU n_shared_experts x wide
  int moe_every = 1;
  int first_dense = 0;
  std::string router = "softmax";  // softmax (Mixtral, Qwen3-MoE) | sigmoid (DeepSeek-V3)
  bool router_renormalize = true;  // the top_k weights divided by their sum
  double aux_loss_coeff = 0.01;    // Switch/GShard load-balancing loss
  double z_loss_coeff = 0.0;       // router z-loss
  // DeepSeek-V3's auxiliary-loss-free balancing: each MoE layer's per-expert selection bias
  // moves by this much after every step, up for the experts below the mean load, down for
  // those above (0.001 in DeepSeek-V3); 0 = no bias.
  double router_bias_rate = 0.0;
  // > 0: each expert takes at most ceil(capacity_factor · tokens · top_k / n_experts) rows of a
  // microbatch, in token order; the choices beyond are dropped (counted). 0 = dropless.
  double capacity_factor = 0.0;
  // Benchmarks only: every expert takes the same rows (token t's j-th choice is expert
  // (t·top_k + j) mod n_experts, weighed by the router's scores of those experts), the steady
  // state a trained router approaches, as Megatron-Core's and torchtitan's forced balance.
  bool router_force_balance = false;
  int padded_vocab() const { return (vocab_size + 127) / 128 * 128; }
  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  // Llama's MLP width: 2/3 of 4 d_model, rounded up to multiple_of, unless ffn_hidden is set.
  int ffn() const {
    if (ffn_hidden > 0) return ffn_hidden;
    const int h = 2 * (4 * d_model) / 3;
    return (h + multiple_of - 1) / multiple_of * multiple_of;
  }
  // model.arch's family (throws for an unknown one; validate_config names it first).
  const ModelFamily& family() const { return model_family(arch); }
  bool tied() const {
    const ModelFamily* f = find_model_family(arch);
    return (f && f->always_tied) || tie_embeddings;
  }
  bool moe(int block) const { return n_experts > 0 && block >= first_dense && (block - first_dense) % moe_every == 0; }
  int expert_ffn() const { return expert_ffn_hidden > 0 ? expert_ffn_hidden : ffn(); }
  int moe_blocks() const {
    int n = 0;
    for (int b = 0; b < n_layer; ++b) n += moe(b);
    return n;
  }
};

// The grid (core/grid_shape.hpp) and how the model and its work are laid over it.
struct ParallelConfig : GridShape {
  int virtual_stages = 1;               // stages per pipeline rank
  std::vector<double> layers_per_stage;  // blocks per stage (x.5: a half block); empty = "auto" (balanced by cost)
  bool zero1 = false;                    // shard AdamW moments over the dp replicas (parallel.shard = "optimizer")
  std::vector<int> recompute_stages;    // stages train.recompute applies to; empty = "all"
  double dp_bucket_mb = 25;             // most MiB of gradients one dp all-reduce carries
  // Every pipeline x tensor-parallel rank of a replica holds a slice of the vocabulary of
  // the embedding and the output layer (schedule/vocab_pieces.hpp); "auto" turns it on
  // where the output layer outweighs a stage's share of the model (plan/vocab_choice.hpp).
  Toggle vocab_parallel = Toggle::Auto;
  // Sequence parallelism (Megatron's): with tp > 1 the activations between the tensor-
  // parallel products are split by rows (tokens) over the tp ranks: norms and residuals run
  // on a rank's rows, all-gathers feed the column-parallel products and reduce-scatters
  // leave the row-parallel ones. "auto": on wherever tp > 1 divides a rank's tokens
  // (sequence_parallel_on).
  Toggle sequence_parallel = Toggle::Auto;
  // Sharded data parallelism over the replicas (dp x cp; schedule/shard_pass.hpp): "none";
  // "optimizer" (ZeRO-1: the AdamW moments); "gradients" (ZeRO-2: and each unit's gradient,
  // reduce-scattered after its last work of the step); "weights" (ZeRO-3: and the weights,
  // each unit all-gathered around its work). shard_group: the replicas one shard spans,
  // replicated across the groups (0: all of them); shard_reuse: "regather" (a unit's weights
  // gathered for each run of work, the least memory) or "keep" (once per step);
  // shard_prefetch: layers of work a gather is posted ahead of its use.
  std::string shard = "none";
  int shard_group = 0;
  std::string shard_reuse = "regather";
  int shard_prefetch = 1;
};

// parallel.shard, with parallel.zero1 = true meaning at least "optimizer".
enum class ShardLevel { None, Optimizer, Gradients, Weights };
ShardLevel shard_level(const ParallelConfig& p);
const char* to_string(ShardLevel level);

// The ranks one part of a unit spans under "gradients" and "weights" (runtime/unit_shards.hpp):
// parallel.shard_group's replicas (0: every one); an expert-parallel unit's, those of them
// holding the same experts (a shard group takes whole runs of ep ranks: grid_rules.hpp).
struct ShardSpans {
  int dense = 1, experts = 1;
  // What a unit of `elems` over `ranks` holds whole beside its part at most: none where one
  // rank holds it alone (its part is the whole, used in place).
  static double gathered(double elems, int ranks) { return ranks > 1 ? elems : 0.0; }
};
ShardSpans shard_spans(const GridShape& g, int shard_group);

struct ScheduleConfig {
  std::string name = "1f1b";
  std::string file;  // a schedule CSV; overrides name when set
  std::string placement = "loop";  // stage -> rank map of a schedule file: loop | v | "0,1,1,0"
  // Run the schedule's F&B pairs (dualpipev's) overlapped: while one microbatch's expert
  // all-to-all is in flight the other computes. false: one after the other.
  bool overlap = true;
};

struct TrainConfig {
  int steps = 100;
  int global_batch = 8;   // sequences per step, over all dp replicas
  int microbatches = 1;   // per dp replica per step
  int seq_len = 256;
  double lr = 6e-4;
  std::string lr_schedule = "cosine";  // constant | cosine
  int warmup_steps = 0;
  double min_lr = 0.0;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double weight_decay = 0.1;
  bool decay_2d_only = true;  // decay only matrices (not LayerNorm, biases)
  double grad_clip = 1.0;     // global-norm clip; 0 = off
  uint64_t seed = 1337;
  int eval_every = 0;    // validation loss every N steps (and at the end); 0 = never
  int eval_batches = 1;  // global batches of data.val per validation
  // fp32 | bf16: in bf16, activations (and the stash) and the weights products use are
  // bf16; master weights, gradients, reductions, AdamW state and the loss stay fp32.
  std::string precision = "fp32";
  // Activation recomputation: none | selective (blocks recompute attention's softmax and
  // the GELU in backward) | full (blocks keep only their input and recompute in backward).
  std::string recompute = "none";
};

struct DataConfig {
  std::vector<std::string> train;
  std::vector<std::string> val;
  std::string sampling = "sequential";  // sequential | shuffle
  bool respect_documents = false;       // windows inside documents only (Megatron datasets)
  // Sequences packed with whole documents, attention, positions and the loss kept inside
  // each (io/document_packing.hpp, core/documents.hpp).
  bool pack_documents = false;
  // A blend (data.train = [{ path = "...", weight = w }, ...]): one weight per train path;
  // empty: the paths are read as one stream.
  std::vector<double> train_weights;
};

struct CheckpointConfig {
  std::string dir = "checkpoints";
  int every = 0;  // steps between checkpoints; 0 = none on a cadence (SIGUSR1/SIGTERM still write one)
  int keep = 3;
};

struct LogConfig {
  int every = 1;
  std::string metrics;     // JSON Lines file; empty = none (or <dir>/metrics.jsonl)
  std::string file;        // a copy of rank 0's progress lines; empty = none
  std::string dir;         // run directory for `pipetrain report`; empty = none
  double peak_flops = 0;   // peak FLOP/s of one rank's device, for MFU; 0 = not reported
  bool progress = true;    // progress bar + ETA when stdout is a terminal (never in batch jobs)
};

struct RuntimeConfig {
  std::string device = "cpu";  // cpu | cuda
  double timeout_s = 600;  // hang watchdog: longest single wait before the job aborts; 0 = off
  std::string on_nonfinite = "stop";  // non-finite loss or gradient: stop | skip (the update)
  // Keep the weights in the product library's own layout during each step (CPU: oneDNN),
  // so the forward and input-gradient products do not repack them on every microbatch;
  // costs two more copies of the weights (Backend::set_pack_weights). Auto: where it was
  // measured to pay and the copies fit (plan/cost_model's choose_pack_weights).
  Toggle pack_weights = Toggle::Auto;
  // The library of the dense layers' fp32 products: "blas", "onednn" (its sgemm), or
  // "auto": each product where it was timed faster on this node
  // (runtime/product_timing.hpp, plan/product_choice.hpp).
  std::string dense_products = "auto";
};

// How device tensors move between ranks on GPUs (the CPU always uses MPI).
struct CommConfig {
  // Pipeline transfers and the tied-embedding sum: nccl (ncclSend/ncclRecv, one GPU per
  // rank) | mpi (staged through host buffers; ranks may share a GPU) | auto (nccl when the
  // build has NCCL and runtime.device = "cuda", else mpi).
  std::string p2p = "auto";
  // Data-parallel reductions on the CPU progress in a helper thread while the executor
  // computes (comm/progress_thread.hpp), not only when it polls between layers: it calls
  // MPI every progress_us microseconds while buckets are in flight; 0 = no thread.
  int progress_us = 1000;
};

struct Config {
  ModelConfig model;
  ParallelConfig parallel;
  ScheduleConfig schedule;
  TrainConfig train;
  DataConfig data;
  CheckpointConfig checkpoint;
  LogConfig log;
  RuntimeConfig runtime;
  CommConfig comm;
  std::string source;  // the file the config came from (for messages)
};

// Reads `path` (TOML), applies `overrides` ("section.key=value", value in TOML
// syntax or a bare string), validates, and returns the result. Throws
// pipetrain::Error naming the file and key on any unknown key, wrong type or
// impossible value.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

// Same, from TOML text already in memory (`origin` names it in messages).
Config parse_config(const std::string& toml_text, const std::string& origin,
                    const std::vector<std::string>& overrides = {});

// Checks cross-field constraints (divisibility, ranges); throws naming the key.
void validate_config(const Config& cfg);

// The config as TOML text, written by toml++'s serializer: every key, sections and keys in
// alphabetical order (round-trips through parse_config).
std::string to_toml(const Config& cfg);

}  // namespace pipetrain
