// BatchSampler (see pipetrain/io/batch_sampler.hpp): sample number -> window
// (sequential or per-epoch shuffled), and batch filling. The shuffle depends only on
// (n, seed, epoch): splitmix64 derives the epoch's seed, std::mt19937_64 (fully
// specified by the standard) draws, and our own Fisher-Yates with rejection sampling
// turns draws into a permutation, so every platform gets the same order.
#include <algorithm>
#include <random>
#include <utility>

#include "pipetrain/core/error.hpp"
#include "pipetrain/io/batch_sampler.hpp"

namespace pipetrain {
namespace {

uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Uniform in [0, bound), bound >= 1, without modulo bias.
uint64_t uniform_below(std::mt19937_64& rng, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
  for (;;) {
    const uint64_t r = rng();
    if (r >= threshold) return r % bound;
  }
}

}  // namespace

std::vector<int64_t> BatchSampler::permutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> perm(static_cast<size_t>(std::max<int64_t>(n, 0)));
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(i);
  std::mt19937_64 rng(splitmix64(splitmix64(seed) ^ static_cast<uint64_t>(epoch)));
  for (size_t i = perm.size(); i > 1; --i) {
    const auto j = static_cast<size_t>(uniform_below(rng, i));
    std::swap(perm[i - 1], perm[j]);
  }
  return perm;
}

BatchSampler::BatchSampler(const TokenDataset& data, std::string sampling, uint64_t seed)
    : data_(data), sampling_(std::move(sampling)), seed_(seed) {
  if (sampling_ == "shuffle")
    shuffle_ = true;
  else if (sampling_ != "sequential")
    fail("data.sampling must be sequential or shuffle, got '{}'", sampling_);
}

int64_t BatchSampler::window_of(int64_t sample) const {
  if (sample < 0) fail("sample number {} is negative", sample);
  const int64_t n = data_.num_windows();
  if (!shuffle_) return sample % n;
  const int64_t epoch = sample / n;
  if (epoch != perm_epoch_) {
    perm_ = permutation(n, seed_, epoch);
    perm_epoch_ = epoch;
  }
  return perm_[static_cast<size_t>(sample % n)];
}

void BatchSampler::load(int64_t first_sample, int count, int32_t* inputs, int32_t* targets, int32_t* positions) {
  if (count < 0) fail("cannot load {} samples", count);
  const size_t T = static_cast<size_t>(data_.seq_len());
  auto row = [&](int32_t* a, int k) { return a ? a + static_cast<size_t>(k) * T : nullptr; };
  for (int k = 0; k < count; ++k)
    data_.read_sample(window_of(first_sample + k), row(inputs, k), row(targets, k), row(positions, k));
}

int64_t BatchSampler::targets(int64_t first_sample, int count) {
  int64_t n = 0;
  for (int k = 0; k < count; ++k) n += data_.targets_in(window_of(first_sample + k));
  return n;
}

}  // namespace pipetrain
