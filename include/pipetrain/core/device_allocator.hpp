// DeviceAllocator: where the memory pool gets its memory. An interface in core so the
// pool depends on nothing above it; every Backend is one (device memory).
#pragma once
#include <cstddef>

#include "pipetrain/core/device.hpp"

namespace pipetrain {

class DeviceAllocator {
 public:
  virtual ~DeviceAllocator() = default;
  virtual void* allocate(size_t bytes) = 0;  // 64-byte aligned; throws Error when out of memory
  virtual void deallocate(void* p, size_t bytes) = 0;
  virtual DeviceId device() const = 0;  // where allocate()'s memory lives
};

}  // namespace pipetrain
