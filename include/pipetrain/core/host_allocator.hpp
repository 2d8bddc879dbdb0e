// HostAllocator: host memory for a pool (64-byte aligned), e.g. the staging buffers of a
// communicator that moves device tensors through the host. `device` is what the memory
// reports as its device: the host, except in tests that stand a host buffer in for a
// device's memory.
#pragma once
#include "pipetrain/core/device_allocator.hpp"

namespace pipetrain {

class HostAllocator final : public DeviceAllocator {
 public:
  explicit HostAllocator(DeviceId device = {}) : device_(device) {}
  void* allocate(size_t bytes) override;
  void deallocate(void* p, size_t bytes) override;
  DeviceId device() const override { return device_; }

 private:
  DeviceId device_;
};

}  // namespace pipetrain
