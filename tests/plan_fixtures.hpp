// The planner tests' fixtures (test_plan.cpp, test_plan_experts.cpp): a small valid cluster
// file, a small GPT-2 and its config, one node of it, and what ModelStage declares.
#pragma once
#include <string>

#include "pipetrain/core/config.hpp"
#include "pipetrain/model/parameters.hpp"
#include "pipetrain/model/stage.hpp"
#include "pipetrain/plan/cluster.hpp"
#include "pipetrain/plan/cost_model.hpp"

namespace pipetrain::testing {

// A small valid cluster file; one key per line so that a test can drop any one of them.
inline const char* kCluster = R"(name = "test"
nodes = 2
devices_per_node = 4
[device]
kind = "cuda"
memory_gib = 16
reserve_gib = 1
peak_tflops = { fp32 = 10, bf16 = 100 }
gemm_efficiency = 0.5
memory_bandwidth_gbs = 1000
layer_overhead_us = 0
[intra_node]
bandwidth_gbs = 100
latency_us = 2
[inter_node]
bandwidth_gbs = 10
latency_us = 5
)";

inline std::string without_line(const std::string& text, const std::string& starts) {
  std::string out;
  size_t at = 0;
  while (at < text.size()) {
    const size_t end = text.find('\n', at);
    const std::string line = text.substr(at, end - at);
    if (line.rfind(starts, 0) != 0) out += line + "\n";
    at = end == std::string::npos ? text.size() : end + 1;
  }
  return out;
}

inline ModelConfig tiny_gpt2() {
  ModelConfig m;
  m.n_layer = 4, m.n_head = 4, m.d_model = 64, m.vocab_size = 300, m.max_seq_len = 32;
  return m;
}

inline Config tiny_config(int global_batch = 4) {
  Config c;
  c.model = tiny_gpt2();
  c.train.seq_len = 32;
  c.train.global_batch = global_batch;
  c.source = "tiny.toml";
  return c;
}

inline ClusterSpec node_of(int devices, double memory_gib = 16) {
  ClusterSpec c = parse_cluster(kCluster, "test.toml");
  c.nodes = 1;
  c.devices_per_node = devices;
  c.device.memory_bytes = memory_gib * 1073741824.0;
  c.device.reserve_bytes = 0;
  return c;
}

// Counts what ModelStage declares for units [unit, unit + count), on one rank of tp.
inline UnitParams declared(const ModelConfig& m, int unit, int count, int tp_size) {
  ParameterStore one;
  ModelStage a(m, unit, unit + count, one, TensorParallel{0, tp_size});
  double replicated = 0, total = 0;
  for (const auto& p : one.params()) {
    total += static_cast<double>(p.numel());
    int64_t global = 1;
    for (auto d : p.global_shape) global *= d;
    if (global == p.numel()) replicated += static_cast<double>(p.numel());
  }
  return {(total - replicated) * tp_size, replicated};
}

}  // namespace pipetrain::testing
