// BatchSampler: global sample number -> window of a TokenDataset (sequential or
// per-epoch shuffled), and batch filling.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "pipetrain/io/token_dataset.hpp"

namespace pipetrain {

// Maps global sample numbers to windows and fills batches. Keeps a reference to the
// dataset (which must outlive it). Not thread-safe (caches the epoch's permutation).
class BatchSampler {
 public:
  // sampling: "sequential" -> sample i uses window i mod n; "shuffle" -> epoch
  // e = i / n uses a permutation of the n windows seeded by (seed, e), and sample i
  // uses perm_e[i mod n]. Deterministic across platforms (mt19937_64 + own Fisher-Yates).
  BatchSampler(const TokenDataset& data, std::string sampling, uint64_t seed);

  int64_t window_of(int64_t sample) const;
  // For samples first..first+count-1, row k*T.. of each array (T = seq_len): the
  // window's inputs, targets and positions (TokenDataset::read_sample: targets[t] =
  // window[t+1] and positions[t] = t unless documents are packed). Any pointer may be null.
  void load(int64_t first_sample, int count, int32_t* inputs, int32_t* targets, int32_t* positions = nullptr);
  // How many of those samples' targets count (count * T unless documents are packed).
  int64_t targets(int64_t first_sample, int count);

  const std::string& sampling() const { return sampling_; }

  // The permutation of 0..n-1 used by `shuffle` for epoch `epoch` (exposed for tests).
  static std::vector<int64_t> permutation(int64_t n, uint64_t seed, int64_t epoch);

 private:
  const TokenDataset& data_;
  std::string sampling_;
  uint64_t seed_ = 0;
  bool shuffle_ = false;
  mutable int64_t perm_epoch_ = -1;
  mutable std::vector<int64_t> perm_;
};

}  // namespace pipetrain
