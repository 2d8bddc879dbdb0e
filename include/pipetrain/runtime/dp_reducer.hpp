// Data-parallel gradient reduction. Without ZeRO-1, gradients are all-reduced over the
// dp communicator in buckets of bounded size: as the executor reports each layer's last
// weight gradient of the step, the parameters that became final join the open bucket (a
// contiguous range of the flat gradient buffer); a bucket goes out as a nonblocking
// all-reduce once it holds `bucket_bytes` (a parameter larger than that goes out in
// pieces of that size), overlapping the rest of the backward work.
//
// The token embedding's gradient is a few rows of a large table. When the replicas'
// tokens of a step are fewer than this rank's rows of the table (dp x tokens < rows), the
// embedding keeps its rows' gradients aside (EmbeddingRowGradients) and the replicas
// all-gather those rows and their tokens at the end and add them, every replica in the
// same order, instead of all-reducing the dense table; a tied head's dense gradient of
// the same table then goes out early, when the head is done, like any other bucket.
//
// With ZeRO-1 (parallel.zero1) dp rank r owns the flat range [r x shard, (r + 1) x shard)
// of the gradient buffer: the same buckets go out as they become final, but each piece
// is reduced in place to its owner only (a bucket crossing a shard boundary goes as two
// reduces), so the reduction overlaps the backward pass like the all-reduces do and each
// rank ends with the summed gradients of its own range, moving the bytes of a
// reduce-scatter. A tied embedding whose two copies live on two pipeline ranks is held
// back (`late`): its copies' pair sum must come first, and finish() reduces it last.
// The embedding's rows are added after the table's reduce, as without ZeRO-1: on every
// replica, into the whole table, so each owner's range ends right.
//
// Expert parallelism (parallel.ep): a parameter split over the ep ranks (expert_parallel)
// differs between them; its gradient, final like any other, goes out on its own as an
// all-reduce over the ranks holding the same experts (none when ep = dp). Under ZeRO-1 those
// ranks share out the flat buffer's expert-parallel part [expert_begin, end) as the dp
// ranks share out the rest, and each piece is reduced to its owner among them.
#pragma once
#include <map>
#include <memory>
#include <vector>

#include "pipetrain/comm/communicator.hpp"
#include "pipetrain/comm/progress_thread.hpp"
#include "pipetrain/model/embedding.hpp"
#include "pipetrain/model/stage.hpp"

namespace pipetrain {

class Backend;

class DataParallelReducer {
 public:
  struct Options {
    int64_t tokens_per_step = 0;         // this replica's tokens per step (decides the embedding's exchange)
    size_t bucket_bytes = 25u << 20;     // parallel.dp_bucket_mb
    ProgressThread* progress = nullptr;  // held while buckets are in flight, so they advance between polls
    int64_t shard_elems = 0;             // ZeRO-1: > 0, the elements each dp rank owns (reduce, not all-reduce)
    int64_t expert_shard_elems = 0;      // ZeRO-1: of the expert-parallel part, each expert-dp rank's
    Parameter* late = nullptr;           // reduced only by finish() (ZeRO-1's tied embedding)
    std::vector<Parameter*> at_end;      // held by no stage's layer (the vocabulary slice's): reduced by finish()
    Communicator* expert_dp = nullptr;   // the ranks holding this rank's experts (expert_parallel parameters)
  };
  // stages: this rank's stages (their layers name the parameters of each bucket).
  // Reductions are enqueued on the backend's stream (after the gradients they reduce).
  DataParallelReducer(ParameterStore& params, const std::map<int, ModelStage*>& stages, Communicator& dp,
                      Backend& backend, MemoryPool& pool, const Options& options);
  ~DataParallelReducer();

  void begin_step();
  // Layer `layer` of stage `stage` is done accumulating: reduce what became final.
  void layer_final(int stage, int layer);
  void poll();    // lets in-flight reductions progress
  // Waits for every bucket (and reduces any parameter not yet reported, and `late`).
  void finish();
  bool exchanges_embedding_rows() const { return embedding_ != nullptr; }
  int buckets_last_step() const { return buckets_; }

 private:
  void add_ready(const Parameter& p);
  void launch_open();
  void launch(int64_t lo, int64_t hi);
  // ZeRO-1: [lo, hi) reduced over `group`, each piece to its owner (rank r owns
  // [base + r x shard, base + (r + 1) x shard)).
  void reduce_to_owners(Communicator& group, int64_t lo, int64_t hi, int64_t base, int64_t shard);
  void hold_progress();
  void release_progress();

  ParameterStore& params_;
  Communicator& dp_;
  Backend& backend_;
  MemoryPool& pool_;
  int64_t bucket_elems_;
  int64_t shard_elems_, expert_shard_elems_;
  Parameter* late_;
  Communicator* expert_dp_;
  std::vector<Parameter*> at_end_;
  std::map<std::pair<int, int>, std::vector<Parameter*>> layer_params_;  // (stage, layer) -> params
  std::map<Parameter*, int> users_;    // layers that accumulate into each parameter's dense gradient
  std::map<Parameter*, int> pending_;  // users not yet final this step
  int64_t open_lo_ = -1, open_hi_ = -1;  // the open bucket [lo, hi) of the flat buffer
  std::vector<std::unique_ptr<CommRequest>> inflight_;
  int buckets_ = 0;
  Embedding* embedding_ = nullptr;  // set when its rows are exchanged instead
  EmbeddingRowGradients rows_;
  ProgressThread* progress_ = nullptr;
  bool held_ = false;  // progress_ is held for this step's buckets
};

}  // namespace pipetrain
