// ParameterStore: every trainable tensor of a stage, under stable layout-independent
// names ("h.3.attn.qkv.w"), laid out in four flat buffers (values, grads, AdamW m and v)
// so reductions and the optimizer touch contiguous memory. Declaring a name twice
// returns the same parameter: that is how the tied embedding is shared.
#pragma once
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "pipetrain/core/shard.hpp"
#include "pipetrain/core/tensor.hpp"

namespace pipetrain {

class Backend;

enum class Init { Normal, Ones, Zeros };

// How ParameterStore::allocate lays out the flat buffers: the parameters every
// expert-parallel rank holds alike first, then the expert-parallel ones as one run
// [expert_begin(), numel()), so ZeRO-1 can shard each part over the ranks that hold it.
struct FlatLayout {
  bool moments = true;        // without: the AdamW state lives elsewhere (ZeRO-1 shards)
  bool grads = true;          // without: no gradients either (inference: the values alone)
  int64_t align = 16;         // the first part's length is a multiple of this
  int64_t expert_align = 16;  // and the expert-parallel part's
  // Sharded data parallelism (parallel.shard): each run of parameters of one unit
  // (Parameter::unit) starts at, and is padded to, a multiple of this (0: no units). The
  // parameters of none come first, in a run of their own.
  int64_t unit_align = 0;
  // Without: no whole weights either (sharded: each unit's, while gathered), but for the
  // parameters of no unit.
  bool values = true;
};

struct Parameter {
  std::string name;
  std::vector<int64_t> shape;         // local shape
  std::vector<int64_t> global_shape;  // shape of the unsharded tensor
  Shard shard;
  Init init = Init::Zeros;
  double init_std = 0.0;
  int64_t init_rows = -1;  // rows (dim 0) that get the random init; the rest stay 0 (-1 = all)
  int64_t offset = 0;  // into the flat buffers, in elements
  // false: another rank's copy is the one AdamW updates (the first stage's tied table), so
  // this rank keeps no moments for it; set before allocate().
  bool updated = true;
  // Split over the expert-parallel ranks (parallel.ep > 1): its gradient is reduced over the
  // ranks holding the same experts, and the norm and the checkpoint count every rank's part.
  bool expert_parallel = false;
  // false: state the optimizer never touches and no gradient reaches (a router's selection
  // bias, moved by the trainer from the step's loads); checkpointed with the weights, no
  // moments (declare it with updated = false too).
  bool trained = true;
  // Under bf16, products read its widened (f32) copy on every backend, never its bf16 one
  // (the experts' per-expert products; ParameterStore::needs_widened_copy).
  bool f32_products = false;
  int64_t moment_offset = 0;  // into the moment buffers (updated parameters only)
  int unit = -1;              // sharded data parallelism: the rank's unit it belongs to (runtime/shard_units.hpp)
  Tensor value, grad, m, v;  // m, v: undefined when !updated
  // The weights kernels use: undefined in fp32 (they use `value`); in bf16, `value`
  // rounded to bf16 after every update, as bf16 (compute_bf16: the operands of bf16
  // products) and widened to f32 (compute: LayerNorm, bias and embedding kernels, and
  // every product where the backend has no native bf16 products). Where it has, only the
  // vectors (norms, biases) keep the widened copy: products read a matrix's bf16 copy, and so
  // does the embedding's lookup.
  Tensor compute, compute_bf16;
  int64_t compute_offset = -1;  // into the widened flat buffer (-1: none)
  int64_t numel() const;
};

class ParameterStore {
 public:
  // A whole (replicated) parameter.
  Parameter& declare(const std::string& name, std::vector<int64_t> shape, Init init,
                     double init_std = 0.0);
  // A tensor-parallel shard of a parameter whose global shape is `global_shape`.
  Parameter& declare_shard(const std::string& name, std::vector<int64_t> global_shape, Shard shard,
                           Init init, double init_std = 0.0);
  // Lays out the flat buffers (FlatLayout) and zeroes grads and moments. The moment
  // buffers cover the updated parameters only.
  void allocate(MemoryPool& pool, Backend& backend, const FlatLayout& layout = {});
  // GPT-2 initialisation: each parameter from its own named random stream over its
  // global shape, then this rank's shard taken out, so the values do not depend on
  // which rank, stage or tensor-parallel slice holds the parameter.
  void initialize(uint64_t seed, Backend& backend);
  // The same for one parameter (its `value` bound first).
  static void initialize(Parameter& p, uint64_t seed, Backend& backend);
  void zero_grads(Backend& backend);
  // Mixed precision: allocates the compute copies (allocate() first) and keeps them equal
  // to bf16(value) — call refresh_compute after every change of the values. The widened
  // (f32) copies are those of needs_widened_copy(p, backend.bf16_products_native()).
  void allocate_compute(MemoryPool& pool, Backend& backend);
  void refresh_compute(MemoryPool& pool, Backend& backend);
  static bool needs_widened_copy(const Parameter& p, bool native_bf16_products);
  int64_t widened_numel() const { return compute_.defined() ? compute_.numel() : 0; }

  std::deque<Parameter>& params() { return params_; }
  const std::deque<Parameter>& params() const { return params_; }
  Parameter* find(const std::string& name);
  int64_t numel() const { return total_; }  // flat buffer length (with alignment padding)
  int64_t expert_begin() const { return expert_begin_; }  // where the expert-parallel part starts
  int64_t count() const;                     // parameter elements (the model's size)
  int64_t not_updated() const;               // elements of the parameters another rank updates
  const Tensor& values() const { return values_; }
  const Tensor& grads() const { return grads_; }

 private:
  std::vector<Parameter*> in_flat_order();
  std::deque<Parameter> params_;  // deque: references stay valid as we declare
  int64_t total_ = 0, expert_begin_ = 0;
  Tensor values_, grads_, m_, v_, compute_, compute_bf16_;
};

}  // namespace pipetrain
