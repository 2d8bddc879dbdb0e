// The planner's cost model: what one microbatch costs in each kind of unit on one device
// (FLOPs, bytes, tensor-parallel collectives), what messages cost on a link, what AdamW
// costs, and what one rank holds in memory (the run header uses the same estimate).
// docs/cost-model.md writes the formulas down.
// Exports: UnitKind, is_block_part, UnitWork, unit_work, unit_params, widened_params, dense_weight_params,
// rank_dense_weight_params, multiplies_bf16, PackInputs, PackChoice, choose_pack_weights, ActionTimes, unit_times,
// allreduce_seconds, allgather_seconds, p2p_seconds, expert_exchange_seconds, group_link, ring_seconds,
// adamw_seconds, gradient_passes_seconds, MemoryInputs, RankMemory, rank_memory.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "pipetrain/core/config.hpp"
#include "pipetrain/core/dtype.hpp"
#include "pipetrain/model/layer.hpp"
#include "pipetrain/model/partition.hpp"
#include "pipetrain/plan/cluster.hpp"
#include "pipetrain/schedule/shard_pass.hpp"

namespace pipetrain {

// The cost model's units are a stage's pieces (partition.hpp): a whole Block is its
// Attention and Mlp halves together (block_pair.hpp).
using UnitKind = PieceKind;
bool is_block_part(UnitKind kind);  // Block, Attention or Mlp

// One microbatch of N = B x T tokens through one unit, on one of tp ranks.
struct UnitWork {
  double f_flops = 0, i_flops = 0, w_flops = 0;  // forward, backward-input, backward-weight
  double attention_flops = 0;  // the part of f_flops selective recomputation repeats
  double bytes = 0;            // memory-bound bytes of forward + backward (norms, residuals, GELU, rows)
  int allreduces_f = 0, allreduces_i = 0;  // tp all-reduces of an N x C activation (f32)
  int small_reductions_f = 0;              // tp reductions of N floats (the loss's max and sum)
};
// storage_bytes: an activation element (4 in fp32, 2 in bf16). `block`: the block a Block or
// Mlp unit is; a mixture of experts' MLP (ModelConfig::moe(block)) does the active experts'
// work (top_k routed and the shared ones, and the router) and moves its routed rows.
// `context`: the tokens of the whole sequence (0: T) where a rank holds T of them (context
// parallelism): each query attends over the whole causal window, and the ring's flash-style
// backward recomputes the scores (a fifth product beside the four).
UnitWork unit_work(const ModelConfig& model, UnitKind kind, int tp, int B, int T, int storage_bytes = 4, int block = -1,
                   int context = 0);

// Parameters of one unit: `sharded` divides over tp ranks, `replicated` does not, `experts`
// (a mixture of experts' routed experts) over the ep ranks.
struct UnitParams {
  double sharded = 0, replicated = 0, experts = 0;
  // The routed experts split over ep (whole experts) and tp (each one's width).
  double on_rank(int tp, int ep = 1) const { return sharded / tp + replicated + experts / (ep * tp); }
};
// The head's count includes its weight (a tied head holds a copy of the embedding's).
// `block`: the block a Block or Mlp unit is (a mixture of experts' MLP where
// ModelConfig::moe(block)); -1: a dense block.
UnitParams unit_params(const ModelConfig& model, UnitKind kind, int block = -1);
// The whole model's parameters, a tied table counted once (what Trainer::model_params counts).
double model_params(const ModelConfig& model);
// Of a unit's parameters on one rank, those bf16 keeps widened to f32 as well
// (ParameterStore::needs_widened_copy): all of them where the device widens bf16 products;
// else the vectors (norms, biases).
double widened_params(const ModelConfig& model, UnitKind kind, int tp, bool native_bf16_products, int block = -1);
// Of a unit's parameters on one rank, the matrices its dense products multiply by (the
// blocks' projections, the head's table): what runtime.pack_weights keeps two more copies of.
double dense_weight_params(const ModelConfig& model, UnitKind kind, int tp, int block = -1);
// The same for the pieces of one rank's stages: with vocabulary parallelism (vocab_slices
// > 0) the output layer is the rank's slice of it, whichever stages the rank holds.
double rank_dense_weight_params(const ModelConfig& model, const std::vector<StagePiece>& pieces, int tp,
                                int vocab_slices);
// Whether a device multiplies bf16 itself: a GPU, or a device whose bf16 product rate
// (peak_flops: what --calibrate measured, or the file's) is above its fp32 one (products
// that widen their operands run at the f32 rate).
bool multiplies_bf16(const DeviceSpec& device);

// runtime.pack_weights = "auto": whether a run keeps its weights packed, and the copies fit
// within a quarter of the rank's memory. Where the products were timed on the node
// (`measured_pays`: plan/product_choice.hpp's rule, which the trainer applies at start-up
// and the planner with a calibrated cluster file), that decides; elsewhere (a cluster file
// without packed rates) a fixed rule from bench/RESULTS.md (`bench_gemm_libs` and
// `bench_train_gpt2` on two CPUs at d_model 768): microbatches of at most kPackRowsMax rows
// (forward and dx products then take 0.72-0.93 of sgemm's time, which repacks the weight on
// every call), at least two microbatches a step (the reorders after each update pay back
// from 1.1-1.9), matrices of d_model >= kPackModelMin (below it nothing is timed either).
inline constexpr int kPackRowsMax = 512;
inline constexpr int kPackModelMin = 512;
struct PackInputs {
  bool can_pack = false;        // the backend keeps packed copies (CPU: oneDNN's optimized f32 matmul)
  bool f32_products = true;     // false under bf16 where the device multiplies bf16 natively
  int d_model = 0;
  int rows = 0;                 // tokens per microbatch (B x T)
  int microbatches = 0;         // per step, through each stage
  double copies_bytes = 0;      // this rank's two f32 copies: 8 bytes per dense_weight_params element
  double memory_per_rank = 0;   // bytes one rank may count on (the node's, shared); 0 = unknown
  std::optional<bool> measured_pays;  // the timed rule's answer, where the products were timed
};
struct PackChoice {
  bool on = false;
  std::string why;  // for the run header: "128-row microbatches; copies 943 MiB, 8.0% of the rank's 11.5 GiB"
};
PackChoice choose_pack_weights(const PackInputs& in);

double allreduce_seconds(double bytes, int ranks, const LinkSpec& link);   // ring
double allgather_seconds(double bytes, int ranks, const LinkSpec& link);   // bytes = the gathered whole
double p2p_seconds(double bytes, const LinkSpec& link);
// One mixture-of-experts layer's exchange in one direction for one microbatch (the forward's,
// or the backward's): its routed rows (N k x C, f32) to their experts' ranks and back, over
// ep ranks spaced tp apart, and the counts before them.
double expert_exchange_seconds(const ClusterSpec& c, const ModelConfig& model, int tp, int ep, int B, int T);
// The link a group of `size` ranks spaced `stride` apart uses: inside a node when the
// group fits in one (ranks are numbered node by node), else between nodes.
const LinkSpec& group_link(const ClusterSpec& c, int stride, int size);

// Seconds of one unit's actions for one microbatch, the tensor-parallel collectives
// included (counted separately in tp_comm). Recomputation adds its forward work to I.
struct ActionTimes {
  double F = 0, I = 0, W = 0;
  double tp_comm = 0;  // of F + I
};
// `block` and `context` as for unit_work (a mixture of experts' products are per expert:
// measured rates are taken at an expert's rows). `packed`: the dense weights kept packed
// (measured rates with packing, where the cluster file has them).
ActionTimes unit_times(const ClusterSpec& c, const ModelConfig& model, UnitKind kind, int tp, int B, int T,
                       const std::string& precision, Recompute mode, int block = -1, int context = 0,
                       bool packed = false);

// Context parallelism's ring in one attention layer for one microbatch of B sequences of
// `context` tokens over cp ranks (spaced tp apart): what its transfers add to the forward (F)
// and to the backward (I) where the block attended to meanwhile is shorter than the
// transfer. Each of the cp - 1 steps moves a block of keys and values (f32, a tp rank's
// heads) to the next rank; backward, the block's gradients travel with it, and they go home
// after the last step.
ActionTimes ring_seconds(const ClusterSpec& c, const ModelConfig& model, int tp, int cp, int B, int context,
                         const std::string& precision);

// One AdamW step over `params` f32 parameters (28 bytes each: p, g, m, v read; p, m, v written).
double adamw_seconds(double params, const DeviceSpec& d);
// The step's other passes over a rank's gradients: zeroing them (4 bytes written per
// parameter) and the norm (4 read; clipping is folded into AdamW's gradient scale).
double gradient_passes_seconds(double params, const DeviceSpec& d);

// ZeRO-1: of a rank's `params`, the ones it updates: its dp share of those every ep rank
// holds alike, its dp / ep share of its `experts`.
double zero1_share(double params, double experts, int dp, int ep);

// What one pipeline rank holds. stashes[k]: bytes one microbatch keeps in the k-th stage
// this rank runs; peak_inflight: the schedule's most (microbatch, stage) stashes alive.
struct MemoryInputs {
  double params = 0;             // on this rank (its tp shard)
  double not_updated = 0;        // of those, the ones another rank updates: no moments here (not under ZeRO-1)
  double experts = 0;            // of those, the expert-parallel ones (ZeRO-1 shards them over dp / ep)
  int dp = 1;
  int ep = 1;
  bool zero1 = false;
  bool bf16 = false;
  double widened = 0;            // bf16: of the parameters, those also kept widened to f32
  double largest_stash = 0;      // the biggest of its stages' per-microbatch stash
  int peak_inflight = 0;
  // The most its stashes hold at once with the weight pass's gradients and recomputation
  // (memory_estimate.cpp: stash_peak); at least largest_stash x peak_inflight + recompute.
  double stash_peak = 0;
  double recompute = 0;          // the one block recomputation rebuilds at a time
  double activation_bytes = 0;   // one transfer between stages (receive buffers)
  int receive_buffers = 0;       // receives posted ahead (the lowering's lookahead)
  int expert_dp = 1;             // the ranks holding the same experts (their gradients' group)
  // The transport's nonblocking reductions take scratch of their message's size (MPI's:
  // Open MPI's libnbc allocates it per call until completion), and the gradients' all go
  // out before the first completes at worst: the scratch counts them all, a reduce to
  // ZeRO-1's owners (2d - 1) / d times (twice on every rank but the owner). NCCL's none.
  bool reduction_scratch = false;
  double packed = 0;             // runtime.pack_weights: elements kept in the forward's and the input gradient's layouts
  // Vocabulary parallelism: one output slice's stash (vocab_stash_bytes), the most alive at
  // once on the rank, and the collectives' buffers in flight.
  double vocab_stash = 0;
  int vocab_inflight = 0;
  double vocab_buffers = 0;
  // Sharded data parallelism (parallel.shard "gradients" | "weights"): the rank keeps a part
  // of the gradients and moments (and of the weights under "weights") between steps — the
  // dense parameters' over spans.dense ranks, the experts' over spans.experts — plus the
  // units the program holds whole at most (schedule/shard_pass.hpp: Program::shard_peak).
  ShardLevel shard = ShardLevel::None;
  ShardSpans spans;
  double whole_weights = 0, whole_gradients = 0;  // elements (the gradients open or reduce-scattering)
  double in_flight = 0;                           // of those, reduce-scattering (ShardPeak::in_flight): the scratch
  double whole_together = 0;                      // both at the same moment at most (0: their sum)
};
struct RankMemory {
  double weights = 0, gradients = 0, optimizer = 0, compute_copy = 0, packed_copies = 0, activations = 0, buffers = 0;
  double total() const { return weights + gradients + optimizer + compute_copy + packed_copies + activations + buffers; }
};
RankMemory rank_memory(const MemoryInputs& in);

}  // namespace pipetrain
