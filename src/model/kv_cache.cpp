#include "pipetrain/model/kv_cache.hpp"

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/core/error.hpp"

namespace pipetrain {

KvCache::KvCache(MemoryPool& pool, int layers, int capacity, int width) : capacity_(capacity), width_(width) {
  for (int l = 0; l < layers; ++l) {
    k_.push_back(Tensor::empty(pool, {capacity, width}));
    v_.push_back(Tensor::empty(pool, {capacity, width}));
  }
}

void KvCache::store(Backend& backend, int layer, const float* k, const float* v, int ld, int n) {
  if (length_ + n > capacity_)
    fail("generation: {} tokens exceed the context of {} (model.max_seq_len)", length_ + n, capacity_);
  float* kd = k_.at(static_cast<size_t>(layer)).f32() + static_cast<int64_t>(length_) * width_;
  float* vd = v_.at(static_cast<size_t>(layer)).f32() + static_cast<int64_t>(length_) * width_;
  const size_t row = static_cast<size_t>(width_) * sizeof(float);
  for (int i = 0; i < n; ++i) {
    backend.copy(kd + static_cast<int64_t>(i) * width_, k + static_cast<int64_t>(i) * ld, row);
    backend.copy(vd + static_cast<int64_t>(i) * width_, v + static_cast<int64_t>(i) * ld, row);
  }
}

void KvCache::advance(int n) {
  if (length_ + n > capacity_) fail("generation: the cache holds {} tokens, not {}", capacity_, length_ + n);
  length_ += n;
}

}  // namespace pipetrain
