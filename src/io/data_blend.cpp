// BlendedSampler (see pipetrain/io/data_blend.hpp).
#include "pipetrain/io/data_blend.hpp"

#include <numeric>

#include "pipetrain/core/error.hpp"

namespace pipetrain {

BlendedSampler::BlendedSampler(const std::vector<std::string>& paths, const std::vector<double>& weights, int seq_len,
                               int model_vocab, bool respect_documents, const std::string& sampling, uint64_t seed,
                               bool pack_documents, MPI_Comm scan_comm) {
  if (paths.empty() || paths.size() != weights.size()) fail("data.train: a blend needs one weight per source");
  const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
  for (size_t k = 0; k < paths.size(); ++k) {
    if (!(weights[k] > 0)) fail("data.train[{}] ({}): blend weights must be positive, got {}", k, paths[k], weights[k]);
    data_.push_back(std::make_unique<TokenDataset>(std::vector<std::string>{paths[k]}, seq_len, model_vocab,
                                                   respect_documents, pack_documents, scan_comm));
    const TokenDataset& d = *data_.back(), &first = *data_.front();
    if (d.vocab_size() && first.vocab_size() && d.vocab_size() != first.vocab_size())
      fail("{}: vocab_size {} differs from {} of {} (the sources of a blend share one vocabulary)", paths[k],
           d.vocab_size(), first.vocab_size(), paths[0]);
    if (!d.tokenizer().empty() && !first.tokenizer().empty() && d.tokenizer() != first.tokenizer())
      fail("{}: tokenizer {} differs from {} of {} (the sources of a blend share one vocabulary)", paths[k],
           d.tokenizer(), first.tokenizer(), paths[0]);
    samplers_.push_back(std::make_unique<BatchSampler>(d, sampling, seed + k));
    weights_.push_back(weights[k] / total);
  }
  count_.assign(paths.size(), 0);
}

void BlendedSampler::seek(int64_t n) const {
  if (n < at_) {
    at_ = 0;
    std::fill(count_.begin(), count_.end(), 0);
  }
  for (; at_ < n; ++at_) ++count_[static_cast<size_t>(source_of(at_).first)];
}

std::pair<int, int64_t> BlendedSampler::source_of(int64_t n) const {
  if (n < 0) fail("sample number {} is negative", n);
  if (n != at_) seek(n);
  size_t best = 0;
  double lag = -1e300;
  for (size_t k = 0; k < weights_.size(); ++k) {
    const double behind = weights_[k] * static_cast<double>(n + 1) - static_cast<double>(count_[k]);
    if (behind > lag) lag = behind, best = k;
  }
  return {static_cast<int>(best), count_[best]};
}

std::vector<int64_t> BlendedSampler::counts(int64_t n) const {
  seek(n);
  return count_;
}

void BlendedSampler::load(int64_t first_sample, int count, int32_t* inputs, int32_t* targets, int32_t* positions) {
  const int64_t T = data_.front()->seq_len();
  auto row = [&](int32_t* a, int i) { return a ? a + i * T : nullptr; };
  for (int i = 0; i < count; ++i) {
    const auto [k, j] = source_of(first_sample + i);
    samplers_[static_cast<size_t>(k)]->load(j, 1, row(inputs, i), row(targets, i), row(positions, i));
  }
}

int64_t BlendedSampler::targets(int64_t first_sample, int count) {
  // The cached position moves forward only cheaply: restore it, so the loads that follow
  // (from first_sample on) do not walk the stream again from sample 0.
  const int64_t at = at_;
  const std::vector<int64_t> taken = count_;
  int64_t n = 0;
  for (int i = 0; i < count; ++i) {
    const auto [k, j] = source_of(first_sample + i);
    n += samplers_[static_cast<size_t>(k)]->targets(j, 1);
  }
  at_ = at;
  count_ = taken;
  return n;
}

}  // namespace pipetrain
