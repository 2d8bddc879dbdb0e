#include "pipetrain/runtime/dp_reducer.hpp"

#include <algorithm>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/core/error.hpp"

namespace pipetrain {

DataParallelReducer::DataParallelReducer(ParameterStore& params, const std::map<int, ModelStage*>& stages,
                                         Communicator& dp, Backend& backend, MemoryPool& pool, const Options& options)
    : params_(params),
      dp_(dp),
      backend_(backend),
      pool_(pool),
      bucket_elems_(std::max<int64_t>(16, static_cast<int64_t>(options.bucket_bytes / sizeof(float)))),
      shard_elems_(options.shard_elems),
      expert_shard_elems_(options.expert_shard_elems),
      late_(options.late),
      expert_dp_(options.expert_dp),
      at_end_(options.at_end),
      progress_(options.progress) {
  if (shard_elems_ > 0 && shard_elems_ * dp.size() != params.expert_begin())
    fail("ZeRO-1: {} ranks x {} elements do not cover the {} of the gradient buffer", dp.size(), shard_elems_,
         params.expert_begin());
  const int64_t experts = params.numel() - params.expert_begin();
  if (shard_elems_ > 0 && experts > 0 && (!expert_dp_ || expert_shard_elems_ * expert_dp_->size() != experts))
    fail("ZeRO-1: the expert-dp ranks x {} elements do not cover the {} of the expert-parallel gradients",
         expert_shard_elems_, experts);
  for (const auto& [s, stage] : stages) {
    auto& layers = stage->layers();
    for (size_t l = 0; l < layers.size(); ++l) {
      auto ps = layers[l]->parameters();
      if (auto* e = dynamic_cast<Embedding*>(layers[l].get())) {
        // rows = this rank's slice of the table: dense reduction moves ~2 rows x C per rank,
        // the exchange (dp - 1) x tokens x C.
        // Not for a late table: the pair sum would have to carry the rows too.
        const Parameter& wte = *ps.front();
        if (late_ != &wte && static_cast<int64_t>(dp.size()) * options.tokens_per_step < wte.shape[0]) {
          embedding_ = e;
          e->set_row_sink(&rows_);
          ps.erase(ps.begin());  // its dense gradient no longer waits for the embedding
        }
      }
      ps.erase(std::remove(ps.begin(), ps.end(), late_), ps.end());
      layer_params_[{s, static_cast<int>(l)}] = ps;
      for (Parameter* p : ps) users_[p]++;
    }
  }
}

DataParallelReducer::~DataParallelReducer() {
  if (embedding_) embedding_->set_row_sink(nullptr);
  if (held_) progress_->release();
}

void DataParallelReducer::begin_step() {
  pending_ = users_;
  inflight_.clear();
  rows_.clear();
  open_lo_ = open_hi_ = -1;
  buckets_ = 0;
}

void DataParallelReducer::hold_progress() {
  if (progress_ && !held_) {  // the first bucket of the step: keep MPI's engine turning until finish()
    progress_->hold();
    held_ = true;
  }
}

void DataParallelReducer::launch(int64_t lo, int64_t hi) {
  hold_progress();
  for (int64_t a = lo; a < hi; a += bucket_elems_) {  // a parameter larger than a bucket goes in pieces
    const int64_t b = std::min(hi, a + bucket_elems_);
    if (shard_elems_ == 0) {
      inflight_.push_back(dp_.allreduce_sum(params_.grads().view(a, {b - a}), backend_.stream()));
    } else {
      reduce_to_owners(dp_, a, b, 0, shard_elems_);
    }
    ++buckets_;
  }
}

void DataParallelReducer::reduce_to_owners(Communicator& group, int64_t lo, int64_t hi, int64_t base, int64_t shard) {
  for (int64_t x = lo; x < hi;) {
    const int64_t owner = (x - base) / shard, y = std::min(hi, base + (owner + 1) * shard);
    inflight_.push_back(group.reduce_sum(params_.grads().view(x, {y - x}), static_cast<int>(owner), backend_.stream()));
    x = y;
  }
}

void DataParallelReducer::launch_open() {
  if (open_lo_ >= 0) launch(open_lo_, open_hi_);
  open_lo_ = open_hi_ = -1;
}

// Backward finalises layers last to first, so each newly final parameter usually ends
// where the open bucket begins (up to the 16-float padding between parameters).
void DataParallelReducer::add_ready(const Parameter& p) {
  const int64_t lo = p.offset, hi = p.offset + p.numel();
  if (p.expert_parallel) {  // another group's reduction: never in a bucket with the rest
    if (!expert_dp_ || expert_dp_->size() == 1) return;
    hold_progress();
    if (shard_elems_ > 0)
      reduce_to_owners(*expert_dp_, lo, hi, params_.expert_begin(), expert_shard_elems_);
    else
      inflight_.push_back(expert_dp_->allreduce_sum(params_.grads().view(lo, {hi - lo}), backend_.stream()));
    return;
  }
  const auto padded = [](int64_t x) { return (x + 15) / 16 * 16; };
  if (open_lo_ >= 0 && padded(hi) == open_lo_) {
    open_lo_ = lo;
  } else if (open_lo_ >= 0 && padded(open_hi_) == lo) {
    open_hi_ = hi;
  } else {
    launch_open();
    open_lo_ = lo;
    open_hi_ = hi;
  }
  if (open_hi_ - open_lo_ >= bucket_elems_) launch_open();
}

void DataParallelReducer::layer_final(int stage, int layer) {
  std::vector<Parameter*> ready;
  for (Parameter* p : layer_params_[{stage, layer}])
    if (--pending_[p] == 0) ready.push_back(p);
  std::sort(ready.begin(), ready.end(), [](auto* a, auto* b) { return a->offset > b->offset; });
  for (Parameter* p : ready) add_ready(*p);
}

void DataParallelReducer::poll() {
  for (auto& r : inflight_) r->test();
}

void DataParallelReducer::release_progress() {
  if (!held_) return;
  progress_->release();
  held_ = false;
}

void DataParallelReducer::finish() {
  std::vector<Parameter*> rest;
  for (auto& [p, n] : pending_)
    if (n > 0) {
      rest.push_back(p);
      n = 0;
    }
  if (late_) rest.push_back(late_);
  rest.insert(rest.end(), at_end_.begin(), at_end_.end());
  std::sort(rest.begin(), rest.end(), [](auto* a, auto* b) { return a->offset > b->offset; });
  for (Parameter* p : rest) add_ready(*p);
  launch_open();
  if (!embedding_) {
    for (auto& r : inflight_) r->wait();
    inflight_.clear();
    release_progress();
    return;
  }
  // Every replica's embedding rows and tokens, gathered while the buckets finish.
  const int dp = dp_.size();
  const int64_t k = static_cast<int64_t>(rows_.rows.size());
  if (k == 0) fail("data parallelism: the embedding kept no rows this step");
  const int64_t n = rows_.tokens.front().numel();
  const int64_t c = rows_.rows.front().numel() / n;
  Tensor my_tokens = Tensor::empty(pool_, {k * n}, DType::I32), my_rows = Tensor::empty(pool_, {k * n * c});
  for (int64_t i = 0; i < k; ++i) {
    backend_.copy(my_tokens.i32() + i * n, rows_.tokens[static_cast<size_t>(i)].raw(), static_cast<size_t>(n) * 4);
    backend_.copy(my_rows.f32() + i * n * c, rows_.rows[static_cast<size_t>(i)].raw(), static_cast<size_t>(n * c) * 4);
  }
  rows_.clear();
  Tensor all_tokens = Tensor::empty(pool_, {dp * k * n}, DType::I32), all_rows = Tensor::empty(pool_, {dp * k * n * c});
  auto t = dp_.all_gather(my_tokens, all_tokens, backend_.stream());
  auto r = dp_.all_gather(my_rows, all_rows, backend_.stream());
  for (auto& q : inflight_) q->wait();
  inflight_.clear();
  t->wait();
  r->wait();
  release_progress();
  // The same additions in the same order on every replica: the copies stay identical.
  for (int64_t i = 0; i < dp * k; ++i)
    embedding_->scatter_rows(backend_, all_tokens.view(i * n, {n}), all_rows.view(i * n * c, {n, c}));
}

}  // namespace pipetrain
