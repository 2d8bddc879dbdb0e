// Generation's key/value cache: every block's keys and values of the tokens so far, so
// that a new token costs one row of each product per block (and attention over the cached
// rows) instead of a forward pass over the whole sequence. A block seeing a context with
// a cache (MicrobatchContext::kv) stores its new rows at [length, length + n) and attends
// over [0, length + n); the caller advances the length once every block has done so.
#pragma once
#include <vector>

#include "pipetrain/core/memory_pool.hpp"
#include "pipetrain/core/tensor.hpp"

namespace pipetrain {

class Backend;

class KvCache {
 public:
  // layers: the blocks (indexed by their model index); width: key/value floats per token
  // per block (key/value heads x head size).
  KvCache(MemoryPool& pool, int layers, int capacity, int width);

  int capacity() const { return capacity_; }
  int width() const { return width_; }
  int length() const { return length_; }  // tokens cached: the next token's position
  // Copies n rows of keys and values (row i at k + i * ld, v + i * ld) into block
  // `layer`'s cache after its `length()` cached rows; throws when they would not fit.
  void store(Backend& backend, int layer, const float* k, const float* v, int ld, int n);
  const float* keys(int layer) const { return k_.at(static_cast<size_t>(layer)).f32(); }
  const float* values(int layer) const { return v_.at(static_cast<size_t>(layer)).f32(); }
  void advance(int n);  // every block has stored n more rows
  void reset() { length_ = 0; }

 private:
  int capacity_, width_, length_ = 0;
  std::vector<Tensor> k_, v_;
};

}  // namespace pipetrain
