// Expert parallelism's token exchange (parallel.ep) for one microbatch of one MoE layer.
// Rank d of the ep group holds experts [d El, (d + 1) El), El = E / ep. This rank's routed
// rows are sorted by expert (backend/moe_routing.hpp), so each destination's are contiguous. The
// per-expert row counts travel first (El per peer), then the rows, by all-to-all. What
// arrives is ordered by source rank, then expert; dispatch permutes it to expert, then
// source rank, so each local expert's rows are contiguous for its product, and combine
// runs the inverse: the permutation back, then the reverse all-to-all. Without a group
// (or a group of one) both return their input: every expert is here. The all-to-alls are
// nonblocking: settle, dispatch and combine are Steps (comm/steps.hpp) that pause while
// theirs is in flight, where the executor may run another microbatch (settle's pause, on
// the counts, is brief: its driver may resume it from between another's products).
// Exports: ExpertSpans, ExpertExchange.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "pipetrain/backend/moe_routing.hpp"
#include "pipetrain/comm/steps.hpp"
#include "pipetrain/core/tensor.hpp"

namespace pipetrain {

class Backend;
class Communicator;

// Each local expert's rows: how many, and where its first one is.
struct ExpertSpans {
  std::vector<int> count, offset;
  int rows = 0;
};

class ExpertExchange {
 public:
  // Posts the counts' all-to-all: every rank of `group` constructs its own at the same
  // point of the same program.
  // high_water (or null): the most rows a local tensor has had in this layer, raised here.
  ExpertExchange(const RouteCounts& routing, Communicator* group, Backend& backend, MemoryPool& pool,
                 int64_t* high_water = nullptr);
  // Waits for the counts (a pause) and derives local() and the permutations from them;
  // before anything below.
  Steps<> settle();
  const ExpertSpans& local() const { return local_; }
  // A tensor of this rank's expert rows (local().rows, width). Under ep their count changes
  // every microbatch and the pool caches blocks by exact size, so the block's rows are
  // rounded up to a multiple of 1/8 of this rank's routed rows and never fall below the
  // layer's high-water mark: one size a width once the mark settles, so the pool reuses its
  // blocks instead of caching one of every size two microbatches in flight meet.
  Tensor local_tensor(int64_t width, DType type = DType::F32) const;
  // (routed rows, W) in this rank's sorted order -> (local().rows, W) by local expert, over
  // `via`: the group, or its twin (the same ranks) that the backward exchanges over.
  Steps<Tensor> dispatch(Tensor rows, Communicator* via) const;
  // The inverse: (local().rows, W) -> (routed rows, W) back in this rank's sorted order.
  Steps<Tensor> combine(Tensor rows, Communicator* via) const;

 private:
  bool exchanges() const { return group_ != nullptr; }
  std::unique_ptr<CommRequest> exchange(Communicator* via, const Tensor& in, const std::vector<int64_t>& out_rows,
                                        const Tensor& got, const std::vector<int64_t>& in_rows) const;

  Communicator* group_;  // null: every expert here
  Backend& backend_;
  MemoryPool& pool_;
  std::vector<int32_t> counts_out_, counts_in_;  // per (peer, its local expert), on the host
  Tensor counts_out_t_, counts_in_t_;            // in flight
  std::unique_ptr<CommRequest> counts_;
  std::vector<int64_t> send_rows_, recv_rows_;  // per peer
  Tensor to_expert_order_, to_source_order_;    // int32 row permutations of what arrived
  ExpertSpans local_;
  int routed_ = 0;        // this rank's routed rows (tokens x top_k)
  int64_t* high_water_;   // the layer's (or null)
  int64_t capacity_ = 0;  // the rows of every local tensor's block (settle)
};

}  // namespace pipetrain
