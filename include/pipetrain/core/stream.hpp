// Stream: an ordered queue of work on one device. Work enqueued on a stream runs in the
// order it was enqueued; work on different streams may overlap unless a request or an
// event orders it. The host's stream runs each piece of work in the calling thread when it
// is enqueued; a CUDA backend's stream is a cudaStream_t. Exports: Stream, host_stream.
#pragma once
#include <string>

#include "pipetrain/core/device.hpp"

namespace pipetrain {

class Stream {
 public:
  virtual ~Stream() = default;
  virtual DeviceId device() const = 0;
  virtual std::string name() const = 0;
  // Blocks the host until everything enqueued so far has run.
  virtual void synchronize() = 0;
  // The device API's handle (a cudaStream_t for a CUDA stream; null for the host's).
  virtual void* native_handle() const { return nullptr; }
};

// The host's stream (work runs when enqueued; synchronize() returns at once).
Stream& host_stream();

}  // namespace pipetrain
