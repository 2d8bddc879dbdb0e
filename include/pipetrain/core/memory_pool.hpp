// MemoryPool: caches device allocations by exact size so that the steady state of
// training allocates nothing (every step asks for the same sizes in the same order).
// Buffers are handed out as shared_ptr<PoolBlock>; dropping the last reference
// returns the block to the pool's free list, not to the system.
#pragma once
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>

#include "pipetrain/core/device_allocator.hpp"

namespace pipetrain {

class MemoryPool;

struct PoolBlock {
  void* ptr = nullptr;
  size_t bytes = 0;
};

struct PoolStats {
  size_t reserved_bytes = 0;      // obtained from the backend, cached or in use
  size_t in_use_bytes = 0;        // currently handed out
  size_t peak_in_use_bytes = 0;   // high-water mark of in_use_bytes
  size_t system_allocations = 0;  // calls to DeviceAllocator::allocate so far
};

class MemoryPool : public std::enable_shared_from_this<MemoryPool> {
 public:
  static std::shared_ptr<MemoryPool> create(DeviceAllocator& allocator);
  ~MemoryPool();
  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;

  // A block of at least `bytes` bytes (64-byte aligned), reused when one is free.
  std::shared_ptr<PoolBlock> acquire(size_t bytes);
  // Returns every cached free block to the backend.
  void release_cached();
  PoolStats stats() const;
  // Starts a new high-water mark from what is in use now (to measure one phase).
  void reset_peak();
  DeviceAllocator& allocator() const { return backend_; }
  DeviceId device() const { return backend_.device(); }  // one pool per device

 private:
  explicit MemoryPool(DeviceAllocator& allocator) : backend_(allocator) {}
  void give_back(PoolBlock* block);

  DeviceAllocator& backend_;  // the memory source (a Backend)
  mutable std::mutex mutex_;
  std::multimap<size_t, void*> free_;  // size -> cached block
  PoolStats stats_;
};

}  // namespace pipetrain
