// One rank's state under sharded data parallelism (parallel.shard = "gradients" |
// "weights"; schedule/shard_pass.hpp). Each unit (runtime/shard_units.hpp) is a run
// [lo, hi) of the flat parameter buffers, a multiple of 16 x the shard group's ranks long;
// group rank r holds its r-th part — of the gradient and the AdamW moments and, under
// "weights", of the weights too, where no whole copy is kept. The program's instructions
// move a unit between whole and shards:
//   GATHER_W  all-gathers the unit's weights into a pooled buffer the parameters point at
//             (waited for at the first layer that reads them);
//   FREE_W    gives the buffer back (the parameters point at nothing);
//   REDUCE_SCATTER_G  sums the unit's gradient, opened (pooled, zeroed) at the first
//             layer that writes it, into this rank's part, in chunks of kScatterChunk
//             elements (each call's transport scratch stays below the malloc threshold, so a
//             step takes no page faults for it); beyond kScattersInFlight units in flight
//             the oldest is waited for.
// Across shard groups (parallel.shard_group), the parts are then all-reduced over the
// ranks that hold the same one. A unit of expert-parallel experts shards over the group's
// ranks holding the same experts; where one rank holds them alone its part is the whole, used
// in place: GATHER_W points the parameters into it, its gradient sums there, and neither
// moves.
// Under bf16 with "weights" (gather in bf16, reduce in f32) each rank also keeps its part
// rounded to bf16, and GATHER_W all-gathers those: the unit's parameters get their bf16
// copies (compute_bf16) and, once the gather is waited for, the widened f32 copies kernels
// read (compute; ParameterStore::needs_widened_copy) — the products' operands of an
// unsharded bf16 run, bit for bit; no whole f32 value is made.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/comm/communicator.hpp"
#include "pipetrain/core/config.hpp"
#include "pipetrain/core/memory_pool.hpp"
#include "pipetrain/model/parameters.hpp"
#include "pipetrain/runtime/shard_units.hpp"

namespace pipetrain {

// Elements one reduce-scatter call carries at most (libnbc's scratch: twice that, 16 MiB).
inline constexpr int64_t kScatterChunk = int64_t{2} << 20;

class UnitShards {
 public:
  struct Piece {
    int64_t lo = 0, hi = 0;                                               // [lo, hi) of the flat buffers
    float *value = nullptr, *grad = nullptr, *m = nullptr, *v = nullptr;  // at lo
  };
  struct Groups {
    Communicator& dense;    // the ranks one part spans
    Communicator* experts;  // an expert-parallel unit's (null: the rank holds no experts)
    Communicator* across;   // the ranks holding the same part in other groups (null: one group)
  };
  // `weights`: the weights are sharded too (the store allocated no whole values).
  UnitShards(ParameterStore& params, RankUnits units, Groups groups, bool weights, MemoryPool& pool, Backend& backend,
             bool bf16 = false);
  // (Never waits: a step ended by an error abandons what is in flight, like every request.)

  // "weights": each unit's initial values, made whole one unit at a time and cut.
  void initialize(uint64_t seed);
  // bf16 with "weights": the bf16 parts from the f32 ones (after every change of them).
  void refresh_bf16();
  // A SHARD instruction of the program.
  void run(const Instr& in);
  // Before a layer's work: the units it reads gathered (waited for), those it writes open.
  void layer_work(int stage, int layer, bool reads, bool writes);
  void poll();  // gives back the gradients whose reduce-scatter is done
  // Seconds the step's layers waited for their units' gathers (the exposed part), from 0
  // at begin_step.
  void begin_step() { gather_wait_s_ = 0; }
  double gather_wait_s() const { return gather_wait_s_; }
  // After the program: every reduce-scatter done, summed across the groups.
  void finish();

  // This rank's part of `p` (lo == hi: none).
  Piece piece(const Parameter& p);
  // f(param, piece) over every parameter's part.
  void for_each(const std::function<void(Parameter&, const Piece&)>& f);
  // "gradients": every unit's new values from each rank's part (the whole weights are kept).
  void gather_values();
  // "weights": every unit gathered and kept (a run's weights to read after training).
  void gather_all();
  // The whole reduced gradient of every unit, as a flat buffer of the store's layout.
  std::vector<float> whole_gradients();
  bool shards_weights() const { return weights_; }
  // The first group's parts count once where groups repeat them.
  bool first_group() const { return !across_ || across_->rank() == 0; }
  // This rank's part of p's reduced gradient, as a tensor (undefined: none).
  Tensor grad_part(const Parameter& p);

 private:
  struct Unit {
    UnitRef ref;
    Communicator* group = nullptr;  // the ranks its part spans
    std::vector<Parameter*> params;
    int64_t lo = 0, hi = 0, at = 0;  // its range of the flat buffers; its part's place in the part buffers
    Tensor whole_w, whole_g;
    Tensor whole_b;  // bf16 with "weights": the gathered bf16 copies
    std::unique_ptr<CommRequest> gather;
    // The reduce-scatter in flight: one call per chunk of the unit, each on a pooled copy of
    // its pieces (the whole gradient goes back as soon as they are copied).
    std::vector<std::unique_ptr<CommRequest>> scatter;
    std::vector<Tensor> staging;
  };
  int64_t part(const Unit& u) const { return (u.hi - u.lo) / u.group->size(); }
  int64_t part_lo(const Unit& u) const { return u.lo + u.group->rank() * part(u); }
  bool in_place(const Unit& u) const { return u.group->size() == 1; }
  void post_gather(Unit& u, bool values);  // the f32 values, else (bf16) the rounded parts
  void end_gather(Unit& u);                // waits; bf16: then the widened copies
  void bind_bf16(Unit& u);                 // the parameters' compute_bf16 into whole_b
  void widen(Unit& u);                     // their widened f32 copies from the bf16 ones
  bool gathered(const Unit& u) const { return u.whole_w.defined() || u.whole_b.defined(); }
  void free_weights(Unit& u);
  void open_gradient(Unit& u);
  void close_gradient(Unit& u);
  void post_scatter(Unit& u);
  bool scatter_done(Unit& u);  // tests, without waiting
  void end_scatter(Unit& u);   // waits

  ParameterStore& params_;
  Communicator* across_;
  bool weights_, bf16_;
  MemoryPool& pool_;
  Backend& backend_;
  std::vector<Unit> units_;
  std::map<UnitRef, int> index_;
  std::deque<int> scattering_;                              // the units whose reduce-scatter is in flight, oldest first
  std::map<std::pair<int, int>, std::vector<int>> layers_;  // (stage, layer) -> units
  Tensor w_, g_, m_, v_;                                    // this rank's parts, unit after unit
  Tensor wb_;                                               // bf16 with "weights": w_ rounded
  double gather_wait_s_ = 0;
};

}  // namespace pipetrain
