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
// With ZeRO-1 (parallel.zero1) the whole gradient buffer is reduce-scattered at the end
// of the step instead: each dp rank keeps the summed gradients of its 1/dp shard.
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
  // stages: this rank's stages (their layers name the parameters of each bucket).
  // tokens_per_step: this replica's tokens per step (decides the embedding's exchange).
  // Reductions are enqueued on the backend's stream (after the gradients they reduce).
  // progress (may be null): held while buckets are in flight, so they advance between polls.
  DataParallelReducer(ParameterStore& params, const std::map<int, ModelStage*>& stages, Communicator& dp,
                      Backend& backend, MemoryPool& pool, int64_t tokens_per_step, size_t bucket_bytes,
                      ProgressThread* progress = nullptr);
  ~DataParallelReducer();

  void begin_step();
  // Layer `layer` of stage `stage` is done accumulating: reduce what became final.
  void layer_final(int stage, int layer);
  void poll();    // lets in-flight reductions progress
  void finish();  // waits for every bucket (and reduces any parameter not yet reported)
  bool exchanges_embedding_rows() const { return embedding_ != nullptr; }
  int buckets_last_step() const { return buckets_; }

 private:
  void add_ready(const Parameter& p);
  void launch_open();
  void launch(int64_t lo, int64_t hi);
  void release_progress();

  ParameterStore& params_;
  Communicator& dp_;
  Backend& backend_;
  MemoryPool& pool_;
  int64_t bucket_elems_;
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
