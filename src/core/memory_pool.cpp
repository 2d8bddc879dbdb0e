#include "pipetrain/core/memory_pool.hpp"

#include <algorithm>


namespace pipetrain {

namespace {
constexpr size_t kAlign = 64;
size_t round_up(size_t bytes) { return std::max<size_t>(kAlign, (bytes + kAlign - 1) / kAlign * kAlign); }
}  // namespace

std::shared_ptr<MemoryPool> MemoryPool::create(DeviceAllocator& allocator) {
  return std::shared_ptr<MemoryPool>(new MemoryPool(allocator));
}

MemoryPool::~MemoryPool() { release_cached(); }

std::shared_ptr<PoolBlock> MemoryPool::acquire(size_t bytes) {
  const size_t size = round_up(bytes);
  void* ptr = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = free_.find(size); it != free_.end()) {
      ptr = it->second;
      free_.erase(it);
    }
  }
  if (!ptr) {
    ptr = backend_.allocate(size);
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.reserved_bytes += size;
    stats_.system_allocations++;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.in_use_bytes += size;
    stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  }
  // The deleter keeps the pool alive until every block it handed out is back.
  auto self = shared_from_this();
  return std::shared_ptr<PoolBlock>(new PoolBlock{ptr, size},
                                    [self](PoolBlock* b) { self->give_back(b); });
}

void MemoryPool::give_back(PoolBlock* block) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.in_use_bytes -= block->bytes;
    free_.emplace(block->bytes, block->ptr);
  }
  delete block;
}

void MemoryPool::release_cached() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [size, ptr] : free_) {
    backend_.deallocate(ptr, size);
    stats_.reserved_bytes -= size;
  }
  free_.clear();
}

void MemoryPool::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_in_use_bytes = stats_.in_use_bytes;
}

PoolStats MemoryPool::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace pipetrain
