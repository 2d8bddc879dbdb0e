// host_stream() of pipetrain/core/stream.hpp.
#include "pipetrain/core/stream.hpp"

namespace pipetrain {

namespace {

class HostStream final : public Stream {
 public:
  DeviceId device() const override { return {DeviceKind::Host, 0}; }
  std::string name() const override { return "host"; }
  void synchronize() override {}
};

}  // namespace

Stream& host_stream() {
  static HostStream stream;
  return stream;
}

}  // namespace pipetrain
