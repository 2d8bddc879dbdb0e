// A blend of token sources (data.train = [{ path, weight }, ...]): global sample n comes
// from the source whose share is furthest behind its weight — source k with the largest
// w_k (n + 1) - c_k(n), where c_k(n) counts the samples before n taken from k (ties: the
// lowest k) — as the c_k(n)-th sample of that source's own sampler. The stream depends on
// the weights and the sample number only, so a run resumed at any step, on any grid,
// continues it exactly; after N samples every |c_k - w_k N| < 1.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pipetrain/io/batch_sampler.hpp"
#include "pipetrain/io/token_dataset.hpp"

namespace pipetrain {

class BlendedSampler {
 public:
  // One dataset and sampler per source (paths[k], weights[k] > 0, normalised here); each
  // source's windows are drawn by its own BatchSampler (`sampling`, `seed`). Throws naming
  // the file when sources disagree on the vocabulary size or the tokenizer.
  // scan_comm: as TokenDataset's.
  BlendedSampler(const std::vector<std::string>& paths, const std::vector<double>& weights, int seq_len,
                 int model_vocab, bool respect_documents, const std::string& sampling, uint64_t seed,
                 bool pack_documents = false, MPI_Comm scan_comm = MPI_COMM_SELF);

  // (source, sample index within it) of global sample n.
  std::pair<int, int64_t> source_of(int64_t n) const;
  // Samples per source among the first n global samples.
  std::vector<int64_t> counts(int64_t n) const;
  // As BatchSampler's.
  void load(int64_t first_sample, int count, int32_t* inputs, int32_t* targets, int32_t* positions = nullptr);
  int64_t targets(int64_t first_sample, int count);

  int num_sources() const { return static_cast<int>(data_.size()); }
  const TokenDataset& dataset(int k) const { return *data_[static_cast<size_t>(k)]; }
  double weight(int k) const { return weights_[static_cast<size_t>(k)]; }

 private:
  // Advances the cached position to n (from 0 when n lies behind it).
  void seek(int64_t n) const;

  std::vector<std::unique_ptr<TokenDataset>> data_;
  std::vector<std::unique_ptr<BatchSampler>> samplers_;
  std::vector<double> weights_;
  mutable int64_t at_ = 0;              // the cache: the counts before sample at_
  mutable std::vector<int64_t> count_;
};

}  // namespace pipetrain
