#include "pipetrain/runtime/dp_reducer.hpp"

#include <algorithm>

namespace pipetrain {

DataParallelReducer::DataParallelReducer(ParameterStore& params, const std::map<int, ModelStage*>& stages,
                                         Communicator& dp, Stream& stream)
    : params_(params), dp_(dp), stream_(stream) {
  for (const auto& [s, stage] : stages) {
    auto& layers = stage->layers();
    for (size_t l = 0; l < layers.size(); ++l) {
      auto ps = layers[l]->parameters();
      layer_params_[{s, static_cast<int>(l)}] = ps;
      for (Parameter* p : ps) users_[p]++;
    }
  }
}

void DataParallelReducer::begin_step() {
  pending_ = users_;
  inflight_.clear();
  launched_before_finish_ = 0;
}

void DataParallelReducer::launch(std::vector<Parameter*> ready) {
  if (ready.empty()) return;
  // Adjacent parameters of the flat buffer go out as one message.
  std::sort(ready.begin(), ready.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  const Tensor& grads = params_.grads();
  auto bucket = [&](int64_t lo, int64_t hi) { return dp_.allreduce_sum(grads.view(lo, {hi - lo}), stream_); };
  int64_t lo = ready[0]->offset, hi = lo;
  for (Parameter* p : ready) {
    if (p->offset > (hi + 15) / 16 * 16) {
      inflight_.push_back(bucket(lo, hi));
      lo = p->offset;
    }
    hi = p->offset + p->numel();
  }
  inflight_.push_back(bucket(lo, hi));
}

void DataParallelReducer::layer_final(int stage, int layer) {
  std::vector<Parameter*> ready;
  for (Parameter* p : layer_params_[{stage, layer}])
    if (--pending_[p] == 0) ready.push_back(p);
  launched_before_finish_ += static_cast<double>(ready.size());
  launch(std::move(ready));
}

void DataParallelReducer::poll() {
  for (auto& r : inflight_) r->test();
}

void DataParallelReducer::finish() {
  std::vector<Parameter*> rest;
  for (auto& [p, n] : pending_)
    if (n > 0) {
      rest.push_back(p);
      n = 0;
    }
  launch(std::move(rest));
  for (auto& r : inflight_) r->wait();
  inflight_.clear();
}

}  // namespace pipetrain
