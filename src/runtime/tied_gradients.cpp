#include "pipetrain/runtime/tied_gradients.hpp"

#include <algorithm>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/core/error.hpp"

namespace pipetrain {

namespace {
constexpr int kHeadGradTag = 1, kSumTag = 2, kValuesTag = 3;
}

TiedGradientExchange::TiedGradientExchange(Parameter& wte, Communicator& pair, const std::map<int, ModelStage*>& stages,
                                           Backend& backend, MemoryPool& pool, bool send_early,
                                           int64_t row_tokens)
    : wte_(wte), pair_(pair), backend_(backend), pool_(pool), send_early_(send_early) {
  if (pair.size() != 2) fail("tied embedding: the pair communicator has {} ranks, not 2", pair.size());
  for (const auto& [s, stage] : stages) {
    const auto& layers = stage->layers();
    for (size_t l = 0; l < layers.size(); ++l) {
      const auto ps = layers[l]->parameters();
      if (std::find(ps.begin(), ps.end(), &wte) == ps.end()) continue;
      head_layers_.insert({s, static_cast<int>(l)});
      // Scattering the step's rows touches tokens x C floats, the dense add the whole table.
      auto* e = dynamic_cast<Embedding*>(layers[l].get());
      if (first() && e && !e->has_row_sink() && row_tokens > 0 && row_tokens < wte.shape[0]) {
        embedding_ = e;
        e->set_row_sink(&rows_);
      }
    }
  }
}

// Requests still in flight when a step failed: the job is ending (fail-fast aborts it).
TiedGradientExchange::~TiedGradientExchange() {
  if (embedding_) embedding_->set_row_sink(nullptr);
}

void TiedGradientExchange::begin_step() {
  rows_.clear();
  if (embedding_ && send_early_) other_recv_ = pair_.recv(wte_.grad, 1, kHeadGradTag, backend_.stream());
}

void TiedGradientExchange::start_send() {
  if (!send_) send_ = pair_.send(wte_.grad, 0, kHeadGradTag, backend_.stream());
}

void TiedGradientExchange::layer_final(int stage, int layer) {
  if (!first() && send_early_ && head_layers_.count({stage, layer})) start_send();
}

void TiedGradientExchange::finish() {
  if (first()) {
    if (embedding_) {  // wte.grad = the other copy, then this step's rows in order
      if (!other_recv_) other_recv_ = pair_.recv(wte_.grad, 1, kHeadGradTag, backend_.stream());
      other_recv_->wait();
      other_recv_.reset();
      for (size_t i = 0; i < rows_.rows.size(); ++i)
        embedding_->scatter_rows(backend_, rows_.tokens[i], rows_.rows[i]);
      rows_.clear();
    } else {
      Tensor other = Tensor::empty(pool_, {wte_.numel()});
      pair_.recv(other, 1, kHeadGradTag, backend_.stream())->wait();
      backend_.accumulate(wte_.grad.f32(), other.f32(), static_cast<size_t>(wte_.numel()));
    }
    send_ = pair_.send(wte_.grad, 1, kSumTag, backend_.stream());
    return;
  }
  start_send();  // normally started by the head's last layer_final
  send_->wait();
  send_.reset();
  sum_recv_ = pair_.recv(wte_.grad, 0, kSumTag, backend_.stream());
}

void TiedGradientExchange::receive_sum() {
  if (sum_recv_) sum_recv_->wait();
  sum_recv_.reset();
}

void TiedGradientExchange::start_values() {
  values_ = first() ? pair_.recv(wte_.value, 1, kValuesTag, backend_.stream())
                    : pair_.send(wte_.value, 0, kValuesTag, backend_.stream());
}

void TiedGradientExchange::finish_values() {
  if (values_) values_->wait();
  values_.reset();
}

void TiedGradientExchange::settle() {
  receive_sum();
  if (send_) send_->wait();
  send_.reset();
}

}  // namespace pipetrain
