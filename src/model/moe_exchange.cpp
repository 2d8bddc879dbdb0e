// ExpertExchange (pipetrain/model/moe_exchange.hpp): the counts, the two permutations and
// the all-to-alls that move the routed rows to their experts' ranks and back.
#include "pipetrain/model/moe_exchange.hpp"

#include <algorithm>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/comm/communicator.hpp"
#include "pipetrain/core/error.hpp"

namespace pipetrain {

ExpertExchange::ExpertExchange(const RouteCounts& r, Communicator* group, Backend& backend, MemoryPool& pool,
                               int64_t* high_water)
    : group_(group && group->size() > 1 ? group : nullptr),
      backend_(backend),
      pool_(pool),
      routed_(r.offset.back()),
      high_water_(high_water) {
  if (!exchanges()) {
    local_.count.resize(static_cast<size_t>(r.experts));
    local_.offset.assign(r.offset.begin(), r.offset.end() - 1);
    for (int e = 0; e < r.experts; ++e) local_.count[static_cast<size_t>(e)] = r.count(e);
    local_.rows = r.offset.back();
    return;
  }
  const int ep = group_->size(), El = r.experts / ep;
  if (El * ep != r.experts) fail("parallel.ep ({}) must divide model.n_experts ({})", ep, r.experts);
  // Each peer's El experts' counts out, and in: c[s El + l] = rows source s sends local expert l.
  counts_out_.resize(static_cast<size_t>(r.experts));
  counts_in_.resize(counts_out_.size());
  for (int e = 0; e < r.experts; ++e) counts_out_[static_cast<size_t>(e)] = r.count(e);
  counts_out_t_ = Tensor::empty(pool_, {r.experts}, DType::I32);
  counts_in_t_ = Tensor::empty(pool_, {r.experts}, DType::I32);
  backend_.to_device(counts_out_t_.raw(), counts_out_.data(), counts_out_.size() * sizeof(int32_t));
  const std::vector<int64_t> El_each(static_cast<size_t>(ep), El);
  counts_ = group_->all_to_all_v(counts_out_t_, El_each, counts_in_t_, El_each, backend_.stream());
}

Steps<> ExpertExchange::settle() {
  if (!exchanges()) co_return;
  // El integers a peer: brief. The dispatch's pause always follows (what a driver that
  // resumes this from between another's products relies on: it never ends there).
  co_await InFlight{counts_.get(), true};
  counts_.reset();
  backend_.to_host(counts_in_.data(), counts_in_t_.raw(), counts_in_.size() * sizeof(int32_t));
  counts_out_t_ = {}, counts_in_t_ = {};
  const int ep = group_->size(), El = static_cast<int>(counts_in_.size()) / ep;
  send_rows_.assign(static_cast<size_t>(ep), 0);
  recv_rows_.assign(static_cast<size_t>(ep), 0);
  local_.count.assign(static_cast<size_t>(El), 0);
  for (int s = 0; s < ep; ++s)
    for (int l = 0; l < El; ++l) {
      const auto i = static_cast<size_t>(s * El + l);
      send_rows_[static_cast<size_t>(s)] += counts_out_[i];
      recv_rows_[static_cast<size_t>(s)] += counts_in_[i];
      local_.count[static_cast<size_t>(l)] += counts_in_[i];
    }
  local_.offset.assign(static_cast<size_t>(El), 0);
  for (int l = 1; l < El; ++l)
    local_.offset[static_cast<size_t>(l)] =
        local_.offset[static_cast<size_t>(l - 1)] + local_.count[static_cast<size_t>(l - 1)];
  local_.rows = local_.offset.back() + local_.count.back();
  const int64_t granule = std::max(1, routed_ / 8);
  capacity_ = std::max<int64_t>(1, (local_.rows + granule - 1) / granule) * granule;
  if (high_water_) capacity_ = *high_water_ = std::max(capacity_, *high_water_);
  // Block (s, l) arrives at `arrived` (source-major) and goes to `at` (expert-major).
  std::vector<int32_t> to_expert(static_cast<size_t>(local_.rows)), to_source(to_expert.size());
  std::vector<int> at = local_.offset;
  int arrived = 0;
  for (int s = 0; s < ep; ++s)
    for (int l = 0; l < El; ++l)
      for (int i = 0; i < counts_in_[static_cast<size_t>(s * El + l)]; ++i, ++arrived) {
        const auto j = static_cast<size_t>(at[static_cast<size_t>(l)]++);
        to_expert[j] = arrived;
        to_source[static_cast<size_t>(arrived)] = static_cast<int32_t>(j);
      }
  to_expert_order_ = local_tensor(1, DType::I32);
  to_source_order_ = local_tensor(1, DType::I32);
  backend_.to_device(to_expert_order_.raw(), to_expert.data(), to_expert.size() * sizeof(int32_t));
  backend_.to_device(to_source_order_.raw(), to_source.data(), to_source.size() * sizeof(int32_t));
}

Tensor ExpertExchange::local_tensor(int64_t width, DType type) const {
  if (!exchanges()) return Tensor::empty(pool_, {local_.rows, width}, type);
  return Tensor::empty(pool_, {capacity_, width}, type).view(0, {local_.rows, width});
}

std::unique_ptr<CommRequest> ExpertExchange::exchange(Communicator* via, const Tensor& in,
                                                      const std::vector<int64_t>& out_rows, const Tensor& got,
                                                      const std::vector<int64_t>& in_rows) const {
  if (!via || via->size() != group_->size())
    fail("the expert exchange runs over {} ranks, but is given a group of {}", group_->size(), via ? via->size() : 0);
  const int64_t W = in.shape()[1];
  std::vector<int64_t> out_n, in_n;
  for (size_t p = 0; p < out_rows.size(); ++p) {
    out_n.push_back(out_rows[p] * W);
    in_n.push_back(in_rows[p] * W);
  }
  return via->all_to_all_v(in, out_n, got, in_n, backend_.stream());
}

Steps<Tensor> ExpertExchange::dispatch(Tensor rows, Communicator* via) const {
  if (!exchanges()) co_return rows;
  const int64_t W = rows.shape()[1];
  const Tensor got = local_tensor(W);
  const auto request = exchange(via, rows, send_rows_, got, recv_rows_);
  co_await InFlight{request.get()};
  Tensor out = local_tensor(W);
  backend_.gather_rows(out.f32(), got.f32(), to_expert_order_.i32(), nullptr, local_.rows, static_cast<int>(W));
  co_return out;
}

Steps<Tensor> ExpertExchange::combine(Tensor rows, Communicator* via) const {
  if (!exchanges()) co_return rows;
  const int64_t W = rows.shape()[1];
  const Tensor by_source = local_tensor(W);
  backend_.gather_rows(by_source.f32(), rows.f32(), to_source_order_.i32(), nullptr, local_.rows, static_cast<int>(W));
  Tensor back = Tensor::empty(pool_, {routed_, W});
  const auto request = exchange(via, by_source, recv_rows_, back, send_rows_);
  co_await InFlight{request.get()};
  co_return back;
}

}  // namespace pipetrain
