// A cluster as the planner sees it (CLUSTER.toml): nodes of identical devices, what one
// device can compute and hold, and the two kinds of link between devices.
// Exports: DeviceSpec, UnitRates, LinkSpec, ClusterSpec, load_cluster, parse_cluster,
// cluster_to_toml.
#pragma once
#include <map>
#include <string>
#include <vector>

namespace pipetrain {

// Rates `pipetrain plan --calibrate` measured for one precision, per kind of layer: what
// a block and the head reach in model FLOP/s over forward + backward at microbatches of
// `tokens[k]` tokens (products run faster on bigger operands; between two sizes the rate
// is interpolated in log(tokens), outside them the nearest is used), and the embedding's
// rate in bytes/s over the bytes its lookup and scatter move.
// Where the node can keep weights packed for its products (runtime.pack_weights), the
// same rates with every dense weight packed, and the reorders a step pays for that: per
// block and for the head, in seconds at full width (plan/product_choice.hpp's rule weighs
// them for each layout, as the trainer does for its run).
struct UnitRates {
  std::vector<double> tokens, block_flops, head_flops;
  double embedding_bytes_per_s = 0;
  std::vector<double> block_flops_packed, head_flops_packed;  // empty: not measured
  double block_reorder_s = 0, head_reorder_s = 0;
  double block_at(double n, bool packed = false) const;
  double head_at(double n, bool packed = false) const;
  bool has_packed() const { return !block_flops_packed.empty(); }
};

struct DeviceSpec {
  std::string kind = "cpu";                // cpu | cuda (cuda: flash attention keeps no probabilities)
  double memory_bytes = 0;                 // one device's memory
  double reserve_bytes = 0;                // kept free: runtime, communicator buffers' slack, fragmentation
  std::map<std::string, double> peak_flops;  // per precision ("fp32", "bf16"): the device's peak
  double gemm_efficiency = 0;              // fraction of the peak large products reach
  double memory_bandwidth = 0;             // bytes/s: elementwise work, AdamW
  double layer_overhead_s = 0;             // fixed cost of one layer's action (launches, dispatch)
  std::map<std::string, UnitRates> measured;  // per precision, from --calibrate (overrides the above)
};

// One direction of one device's link: seconds = latency + bytes / bandwidth.
struct LinkSpec {
  double bandwidth = 0;  // bytes/s per device
  double latency = 0;    // s
  double allreduce_bandwidth = 0;  // bytes/s a ring all-reduce reaches per device (0: bandwidth)
  double ring_bandwidth() const { return allreduce_bandwidth > 0 ? allreduce_bandwidth : bandwidth; }
};

struct ClusterSpec {
  std::string name;
  int nodes = 1, devices_per_node = 1;
  DeviceSpec device;
  LinkSpec intra_node, inter_node;
  std::string source;  // the file it came from (for messages)
  int devices() const { return nodes * devices_per_node; }
};

// Reads CLUSTER.toml; a missing or wrong key is a one-line pipetrain::Error naming the
// file and the key (the README lists the keys).
ClusterSpec load_cluster(const std::string& path);
ClusterSpec parse_cluster(const std::string& text, const std::string& source);
// The TOML load_cluster reads back (--calibrate writes it).
std::string cluster_to_toml(const ClusterSpec& c);

}  // namespace pipetrain
