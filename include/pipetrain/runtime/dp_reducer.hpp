// Data-parallel gradient reduction. Without ZeRO-1, gradients are all-reduced over the
// dp communicator in buckets: a bucket (the contiguous parameters of one layer whose
// gradients are final) starts its nonblocking all-reduce as soon as the executor
// reports the layer's last weight gradient of the step, overlapping the rest of the
// backward work. With ZeRO-1 (parallel.zero1) the whole gradient buffer is
// reduce-scattered at the end of the step instead: each dp rank keeps the summed
// gradients of its 1/dp shard of the flat parameter buffer.
#pragma once
#include <map>
#include <memory>
#include <vector>

#include "pipetrain/comm/communicator.hpp"
#include "pipetrain/model/stage.hpp"

namespace pipetrain {

class DataParallelReducer {
 public:
  // stages: this rank's stages (their layers name the parameters of each bucket).
  // Reductions are enqueued on `stream` (the backend's: after the gradients they reduce).
  DataParallelReducer(ParameterStore& params, const std::map<int, ModelStage*>& stages, Communicator& dp,
                      Stream& stream);

  void begin_step();
  // Layer `layer` of stage `stage` is done accumulating: reduce what became final.
  void layer_final(int stage, int layer);
  void poll();    // lets in-flight reductions progress
  void finish();  // waits for every bucket (and reduces any parameter not yet reported)
  double overlapped_s() const { return launched_before_finish_; }  // for statistics

 private:
  void launch(std::vector<Parameter*> ready);

  ParameterStore& params_;
  Communicator& dp_;
  Stream& stream_;
  std::map<std::pair<int, int>, std::vector<Parameter*>> layer_params_;  // (stage, layer) -> params
  std::map<Parameter*, int> users_;    // layers that accumulate into each parameter
  std::map<Parameter*, int> pending_;  // users not yet final this step
  std::vector<std::unique_ptr<CommRequest>> inflight_;
  double launched_before_finish_ = 0;
};

}  // namespace pipetrain
