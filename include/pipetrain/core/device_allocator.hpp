// DeviceAllocator: memory on one device, and the copies between it and the host. An
// interface in core so the pool (and the communicators that stage device data through
// host buffers) depend on nothing above it; every Backend is one (device memory), and
// HostAllocator (host_allocator.hpp) is the host's.
#pragma once
#include <cstddef>
#include <cstring>
#include <string>

#include "pipetrain/core/device.hpp"

namespace pipetrain {

class DeviceAllocator {
 public:
  virtual ~DeviceAllocator() = default;
  virtual void* allocate(size_t bytes) = 0;  // 64-byte aligned; throws Error when out of memory
  virtual void deallocate(void* p, size_t bytes) = 0;
  virtual DeviceId device() const = 0;  // where allocate()'s memory lives
  // The physical device across processes (a GPU's UUID, the same whatever ordinal
  // CUDA_VISIBLE_DEVICES gives it); empty where there is none to name (the host).
  virtual std::string hardware_id() const { return {}; }
  // Host <-> this device; they return once the host memory is safe to use. The defaults
  // are for host memory (plain copies); a device's allocator overrides them.
  virtual void to_device(void* dst, const void* host_src, size_t bytes) {
    if (bytes) std::memcpy(dst, host_src, bytes);
  }
  virtual void to_host(void* host_dst, const void* src, size_t bytes) {
    if (bytes) std::memcpy(host_dst, src, bytes);
  }
};

}  // namespace pipetrain
