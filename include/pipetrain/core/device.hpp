// Where a tensor's memory lives: the host, or CUDA device N. Every memory pool belongs to
// one device (its allocator's), and a tensor records the device of the pool it came from.
// Exports: DeviceKind, DeviceId.
#pragma once
#include <string>

namespace pipetrain {

enum class DeviceKind { Host, Cuda };

struct DeviceId {
  DeviceKind kind = DeviceKind::Host;
  int index = 0;  // the CUDA ordinal; 0 for the host
  bool operator==(const DeviceId&) const = default;
  std::string str() const { return kind == DeviceKind::Host ? "host" : "cuda:" + std::to_string(index); }
};

}  // namespace pipetrain
