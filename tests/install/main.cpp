// Uses the installed library's public API: parses and validates a config, prints it
// back as TOML, and lists the registered pipeline schedules. Exit 0 on success.
#include <cstdio>
#include <string>

#include "pipetrain/core/config.hpp"
#include "pipetrain/core/device.hpp"  // C++20: a defaulted operator==
#include "pipetrain/core/error.hpp"
#include "pipetrain/schedule/registry.hpp"

int main() {
  const std::string text = R"(
[model]
n_layer = 4
n_head = 4
d_model = 128
vocab_size = 256
max_seq_len = 64

[parallel]
pp = 2

[train]
steps = 10
global_batch = 8
microbatches = 4
seq_len = 64

[data]
train = "tokens.h5"
)";
  pipetrain::Config cfg = pipetrain::parse_config(text, "consumer.toml", {"schedule.name=\"zb-h1\""});
  pipetrain::validate_config(cfg);
  if (cfg.model.n_layer != 4 || cfg.parallel.pp != 2 || cfg.schedule.name != "zb-h1") {
    std::fprintf(stderr, "consumer: config did not round-trip\n");
    return 1;
  }
  const std::string toml = pipetrain::to_toml(cfg);
  if (toml.find("zb-h1") == std::string::npos) {
    std::fprintf(stderr, "consumer: to_toml lost schedule.name:\n%s\n", toml.c_str());
    return 1;
  }
  // A bad config must throw pipetrain::Error naming the key.
  bool refused = false;
  try {
    pipetrain::parse_config("[model]\nn_head = 5\nd_model = 128\n", "bad.toml");
  } catch (const pipetrain::Error& e) {
    refused = std::string(e.what()).find("n_head") != std::string::npos;
  }
  if (!refused) {
    std::fprintf(stderr, "consumer: a bad config was not refused\n");
    return 1;
  }
  if (!(pipetrain::DeviceId{} == pipetrain::DeviceId{pipetrain::DeviceKind::Host, 0})) {
    std::fprintf(stderr, "consumer: DeviceId comparison\n");
    return 1;
  }
  const auto schedules = pipetrain::list_schedules();
  std::printf("pipetrain consumer: config ok (%d layers, pp %d, schedule %s); %zu schedules:",
              cfg.model.n_layer, cfg.parallel.pp, cfg.schedule.name.c_str(), schedules.size());
  for (const auto& [name, description] : schedules) std::printf(" %s", name.c_str());
  std::printf("\n");
  return schedules.empty() ? 1 : 0;
}
