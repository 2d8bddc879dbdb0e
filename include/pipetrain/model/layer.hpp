// The Layer interface every model piece implements. Backward is split in two so
// zero-bubble schedules can defer weight gradients:
//   forward          x -> y, saving what backward needs in a per-microbatch Stash
//   backward_input   dy -> dx, keeping what backward_weight needs in the same Stash
//   backward_weight  accumulates parameter gradients, then the Stash can be dropped
// backward() is their composition. Stashes hold pooled tensors, so dropping one
// returns its memory to the pool. An interface: the layers are embedding.hpp, block.hpp,
// loss_head.hpp; their shared products linear.hpp.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pipetrain/comm/steps.hpp"
#include "pipetrain/core/tensor.hpp"
#include "pipetrain/model/parameters.hpp"

namespace pipetrain {

class KvCache;
class MoeStepStats;

class Backend;
class Communicator;

// This rank's place among the tensor-parallel ranks of its stage.
struct TensorParallel {
  int rank = 0, size = 1;
};
// This rank's 1/tp of `total` along dimension `dim` (whole without tensor parallelism).
Shard tp_slice(int dim, int64_t total, TensorParallel tp);

// This rank's place among the expert-parallel ranks of its stage (parallel.ep): it holds
// experts [rank E / size, (rank + 1) E / size) of each mixture-of-experts layer.
struct ExpertParallel {
  int rank = 0, size = 1;
};

// Activation recomputation (train.recompute), trading backward compute for stash memory.
// Selective: blocks drop attention's probabilities and output and the GELU output after
// forward and recompute them at backward_input (kept for backward_weight). Full: the
// executor keeps only a block's input and runs its forward again at backward_input.
// Recomputation repeats the same kernels on the same values: results are bit-identical
// (selective in bf16 recomputes the GELU from the stored pre-activation, which the
// forward's GELU epilogue saw unrounded: there within the bf16 bound instead).
enum class Recompute { None, Selective, Full };
Recompute parse_recompute(const std::string& mode);  // "none" | "selective" | "full"
const char* to_string(Recompute mode);                // the inverse

// What every layer can see while running one microbatch.
struct MicrobatchContext {
  Backend* backend = nullptr;
  MemoryPool* pool = nullptr;
  Communicator* tp = nullptr;  // tensor-parallel peers (null or size 1: none)
  Communicator* ep = nullptr;  // expert-parallel peers (null or size 1: every expert here)
  // Sequence parallelism over `tp` (parallel.sequence_parallel; model/sequence_parallel.hpp).
  bool sequence_parallel = false;
  // Context parallelism (parallel.cp; model/ring_attention.hpp): this rank holds T of each
  // sequence's cp_tokens tokens (chunks i and 2 cp - 1 - i), and attention is a ring over
  // `cp`. Null: the whole sequence is here.
  Communicator* cp = nullptr;
  int cp_tokens = 0;
  int B = 0, T = 0;        // sequences and tokens per sequence in this microbatch
  Tensor tokens;           // (B*T) int32 inputs (first stage)
  Tensor targets;          // (B*T) int32 targets (last stage; kIgnoredTarget counts nowhere)
  // (B*T) int32: each token's place in its document when documents are packed
  // (core/documents.hpp), else its global position under context parallelism, on every
  // stage; undefined: token t is at position t.
  Tensor positions;
  const int32_t* document_positions() const { return positions.defined() ? positions.i32() : nullptr; }
  // (B*T) int32 under context parallelism with packed documents (positions then being the
  // documents' ones): the global position of each token's document's first token, which
  // bounds the keys the ring lets it see; undefined otherwise.
  Tensor document_starts;
  float loss_scale = 0.f;  // d(step loss)/d(token loss); 0 = forward only (evaluation)
  // What activations, activation gradients and the stash are stored as (train.precision;
  // see precision.hpp). Layer inputs and outputs have this dtype; losses are f32.
  DType storage = DType::F32;
  Recompute recompute = Recompute::None;  // this stage's mode
  // Generation: blocks use and extend this key/value cache (the tokens of this context
  // sit at positions kv->length() onwards), and the head returns the logits (N, padded
  // vocabulary) instead of losses when `logits` is set.
  KvCache* kv = nullptr;
  bool logits = false;
  // Training: mixture-of-experts layers add each microbatch's routing here (moe_stats.hpp).
  MoeStepStats* moe = nullptr;
  // Called between a layer's large products (each expert's, a block's two halves): lets
  // communication in flight beside this computation progress, such as the all-to-all of an
  // F&B pair's other microbatch (MPI moves a message only inside its calls). May be empty.
  std::function<void()> progress;
  void between_products() const {
    if (progress) progress();
  }
};

struct Stash {
  virtual ~Stash() = default;
};

class Layer {
 public:
  virtual ~Layer() = default;
  virtual std::string name() const = 0;
  // The parameters whose gradients this layer accumulates.
  virtual std::vector<Parameter*> parameters() = 0;
  // x is undefined for the embedding (it reads ctx.tokens). The loss head returns the
  // per-token losses (B*T).
  virtual Tensor forward(const MicrobatchContext& ctx, const Tensor& x,
                         std::unique_ptr<Stash>& stash) = 0;
  // dy is undefined for the loss head. Returns dx (undefined for the embedding).
  virtual Tensor backward_input(const MicrobatchContext& ctx, const Tensor& dy, Stash& stash) = 0;
  virtual void backward_weight(const MicrobatchContext& ctx, Stash& stash) = 0;
  // forward and backward_input as Steps that pause where the layer's communication is in
  // flight (comm/steps.hpp), so the executor can run an F&B pair's other microbatch there.
  // By default one step: the plain call. A layer that pauses implements these, and its
  // plain calls run them alone.
  virtual Steps<Tensor> forward_steps(const MicrobatchContext& ctx, Tensor x, std::unique_ptr<Stash>& stash);
  virtual Steps<Tensor> backward_input_steps(const MicrobatchContext& ctx, Tensor dy, Stash& stash);
  // Whether the executor may drop this layer's stash after forward and run forward again
  // before backward (train.recompute = "full"): blocks yes; the embedding's stash is tiny
  // and the head's holds the loss gradient its forward computed.
  virtual bool recomputable() const { return false; }
  // Whether, under sequence parallelism, this layer takes and returns (and takes and
  // returns the gradients of) this rank's rows only (model/sequence_parallel.hpp); the
  // others see whole rows.
  virtual bool row_sharded() const { return false; }

  Tensor backward(const MicrobatchContext& ctx, const Tensor& dy, Stash& stash) {
    Tensor dx = backward_input(ctx, dy, stash);
    backward_weight(ctx, stash);
    return dx;
  }
};

// A layer's own stash type, from the Stash it was handed.
namespace layer_util {
template <typename S>
S& as(Stash& s) {
  return static_cast<S&>(s);
}
}  // namespace layer_util

}  // namespace pipetrain
