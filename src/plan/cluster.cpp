// load_cluster(), parse_cluster() and cluster_to_toml() of pipetrain/plan/cluster.hpp.
// Units on disk are the ones people quote (GiB, TFLOP/s, GB/s, microseconds); in memory
// everything is bytes, FLOP/s and seconds.
#include "pipetrain/plan/cluster.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <toml++/toml.h>

#include "pipetrain/core/error.hpp"

namespace pipetrain {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// A table's keys, checked against the ones it may have (a typo is an error, not a default).
class Table {
 public:
  Table(const toml::table* t, std::string where, const std::string& source)
      : t_(t), where_(std::move(where)), source_(source) {}

  double number(const std::string& key, bool required = true, double fallback = 0) {
    known_.insert(key);
    const toml::node* n = t_ ? t_->get(key) : nullptr;
    if (!n) {
      if (required) fail("{}: missing key {}", source_, name(key));
      return fallback;
    }
    const auto v = n->value<double>();
    if (!v) fail("{}: {} must be a number", source_, name(key));
    if (!(*v >= 0)) fail("{}: {} must not be negative (got {})", source_, name(key), *v);
    return *v;
  }
  double positive(const std::string& key) {
    const double v = number(key);
    if (!(v > 0)) fail("{}: {} must be positive (got {})", source_, name(key), v);
    return v;
  }
  int count(const std::string& key) {
    const double v = positive(key);
    // Compared in double first: a value past INT_MAX has no int to cast to.
    if (v > std::numeric_limits<int>::max()) fail("{}: {} is too large (got {})", source_, name(key), v);
    if (v != std::floor(v)) fail("{}: {} must be a whole number (got {})", source_, name(key), v);
    return static_cast<int>(v);
  }
  std::string text(const std::string& key, bool required, std::string fallback = "") {
    known_.insert(key);
    const toml::node* n = t_ ? t_->get(key) : nullptr;
    if (!n) {
      if (required) fail("{}: missing key {}", source_, name(key));
      return fallback;
    }
    const auto v = n->value<std::string>();
    if (!v) fail("{}: {} must be a string", source_, name(key));
    return *v;
  }
  bool has(const std::string& key) const { return t_ && t_->get(key); }
  // A non-empty array of positive numbers (n entries when n > 0), each times `scale`.
  std::vector<double> numbers(const std::string& key, size_t n = 0, double scale = 1) {
    known_.insert(key);
    const toml::node* node = t_ ? t_->get(key) : nullptr;
    if (!node) fail("{}: missing key {}", source_, name(key));
    const toml::array* a = node->as_array();
    if (!a || a->empty()) fail("{}: {} must be an array of numbers", source_, name(key));
    if (n > 0 && a->size() != n) fail("{}: {} must have {} entries (one per tokens)", source_, name(key), n);
    std::vector<double> out;
    for (const auto& e : *a) {
      const auto v = e.value<double>();
      if (!v || !(*v > 0)) fail("{}: {} must hold positive numbers", source_, name(key));
      out.push_back(*v * scale);
    }
    return out;
  }
  const toml::table* table(const std::string& key, bool required) {
    known_.insert(key);
    const toml::node* n = t_ ? t_->get(key) : nullptr;
    if (!n) {
      if (required) fail("{}: missing table [{}]", source_, name(key));
      return nullptr;
    }
    if (!n->is_table()) fail("{}: {} must be a table", source_, name(key));
    return n->as_table();
  }
  // Call last: every key present must have been asked for.
  void no_other_keys() const {
    if (!t_) return;
    for (const auto& [k, v] : *t_)
      if (!known_.count(std::string(k.str())))
        fail("{}: unknown key {}", source_, name(std::string(k.str())));
  }
  std::string name(const std::string& key) const { return where_.empty() ? key : where_ + "." + key; }

 private:
  const toml::table* t_;
  std::string where_;
  const std::string& source_;
  std::set<std::string> known_;
};

LinkSpec read_link(Table& top, const std::string& key, const std::string& source) {
  Table t(top.table(key, true), key, source);
  LinkSpec l;
  l.bandwidth = t.positive("bandwidth_gbs") * 1e9;
  l.latency = t.number("latency_us") * 1e-6;
  l.allreduce_bandwidth = t.number("allreduce_bandwidth_gbs", false, 0) * 1e9;
  t.no_other_keys();
  return l;
}

// Piecewise linear in log(tokens), constant beyond the ends.
double interpolate(const std::vector<double>& x, const std::vector<double>& y, double at) {
  if (x.empty()) return 0;
  if (at <= x.front()) return y.front();
  if (at >= x.back()) return y.back();
  size_t k = 1;
  while (x[k] < at) ++k;
  const double f = (std::log(at) - std::log(x[k - 1])) / (std::log(x[k]) - std::log(x[k - 1]));
  return y[k - 1] + f * (y[k] - y[k - 1]);
}

}  // namespace

double UnitRates::block_at(double n, bool packed) const {
  return interpolate(tokens, packed && has_packed() ? block_flops_packed : block_flops, n);
}
double UnitRates::head_at(double n, bool packed) const {
  return interpolate(tokens, packed && has_packed() ? head_flops_packed : head_flops, n);
}

ClusterSpec parse_cluster(const std::string& text, const std::string& source) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    fail("{}:{}: {}", source, e.source().begin.line, std::string(e.description()));
  }
  ClusterSpec c;
  c.source = source;
  Table top(&root, "", source);
  c.name = top.text("name", false);
  c.nodes = top.count("nodes");
  c.devices_per_node = top.count("devices_per_node");
  {
    Table d(top.table("device", true), "device", source);
    DeviceSpec& dev = c.device;
    dev.kind = d.text("kind", true);
    if (dev.kind != "cpu" && dev.kind != "cuda")
      fail("{}: device.kind must be \"cpu\" or \"cuda\" (got \"{}\")", source, dev.kind);
    dev.memory_bytes = d.positive("memory_gib") * kGiB;
    dev.reserve_bytes = d.number("reserve_gib") * kGiB;
    if (dev.reserve_bytes >= dev.memory_bytes)
      fail("{}: device.reserve_gib must be less than device.memory_gib", source);
    dev.gemm_efficiency = d.positive("gemm_efficiency");
    if (dev.gemm_efficiency > 1) fail("{}: device.gemm_efficiency must be at most 1 (got {})", source, dev.gemm_efficiency);
    dev.memory_bandwidth = d.positive("memory_bandwidth_gbs") * 1e9;
    dev.layer_overhead_s = d.number("layer_overhead_us", false, 0) * 1e-6;
    Table peak(d.table("peak_tflops", true), "device.peak_tflops", source);
    for (const char* p : {"fp32", "bf16"}) {
      const double v = peak.number(p, false, 0) * 1e12;
      if (v > 0) dev.peak_flops[p] = v;
    }
    peak.no_other_keys();
    if (!dev.peak_flops.count("fp32") && !dev.peak_flops.count("bf16"))
      fail("{}: missing key device.peak_tflops.fp32 (or .bf16)", source);
    d.no_other_keys();
  }
  c.intra_node = read_link(top, "intra_node", source);
  c.inter_node = read_link(top, "inter_node", source);
  if (const toml::table* m = top.table("measured", false)) {
    Table measured(m, "measured", source);
    for (const auto& [k, v] : *m) {
      const std::string prec(k.str());
      if (prec != "fp32" && prec != "bf16") continue;  // reported as unknown below
      Table r(measured.table(prec, true), "measured." + prec, source);
      UnitRates u;
      u.tokens = r.numbers("tokens");
      u.block_flops = r.numbers("block_gflops", u.tokens.size(), 1e9);
      u.head_flops = r.numbers("head_gflops", u.tokens.size(), 1e9);
      for (size_t k = 1; k < u.tokens.size(); ++k)
        if (!(u.tokens[k] > u.tokens[k - 1])) fail("{}: {} must increase", source, r.name("tokens"));
      u.embedding_bytes_per_s = r.positive("embedding_gbs") * 1e9;
      if (r.has("block_gflops_packed")) {  // all four, or none
        u.block_flops_packed = r.numbers("block_gflops_packed", u.tokens.size(), 1e9);
        u.head_flops_packed = r.numbers("head_gflops_packed", u.tokens.size(), 1e9);
        u.block_reorder_s = r.number("block_reorder_ms") * 1e-3;
        u.head_reorder_s = r.number("head_reorder_ms") * 1e-3;
      }
      r.no_other_keys();
      if (!c.device.peak_flops.count(prec))
        fail("{}: [measured.{}] needs device.peak_tflops.{}", source, prec, prec);
      c.device.measured[prec] = u;
    }
    measured.no_other_keys();
  }
  top.no_other_keys();
  return c;
}

ClusterSpec load_cluster(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("{}: cannot open the cluster file", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_cluster(ss.str(), path);
}

std::string cluster_to_toml(const ClusterSpec& c) {
  const DeviceSpec& d = c.device;
  std::string peaks;
  for (const auto& [p, v] : d.peak_flops) peaks += fmt::format("{}{} = {:.6g}", peaks.empty() ? "" : ", ", p, v / 1e12);
  std::string name = c.name;
  std::replace(name.begin(), name.end(), '"', '\'');
  std::string out = fmt::format(
      "name = \"{}\"\nnodes = {}\ndevices_per_node = {}\n\n[device]\nkind = \"{}\"\nmemory_gib = {:.6g}\n"
      "reserve_gib = {:.6g}\npeak_tflops = {{ {} }}\ngemm_efficiency = {:.4g}\nmemory_bandwidth_gbs = {:.6g}\n"
      "layer_overhead_us = {:.6g}\n",
      name, c.nodes, c.devices_per_node, d.kind, d.memory_bytes / kGiB, d.reserve_bytes / kGiB, peaks,
      d.gemm_efficiency, d.memory_bandwidth / 1e9, d.layer_overhead_s * 1e6);
  for (const auto& [key, l] : {std::pair{"intra_node", &c.intra_node}, std::pair{"inter_node", &c.inter_node}}) {
    out += fmt::format("\n[{}]\nbandwidth_gbs = {:.6g}\nlatency_us = {:.6g}\n", key, l->bandwidth / 1e9, l->latency * 1e6);
    if (l->allreduce_bandwidth > 0) out += fmt::format("allreduce_bandwidth_gbs = {:.6g}\n", l->allreduce_bandwidth / 1e9);
  }
  auto list = [](const std::vector<double>& v, double scale) {
    std::vector<std::string> s;
    for (double x : v) s.push_back(fmt::format("{:.6g}", x / scale));
    return fmt::format("[{}]", fmt::join(s, ", "));
  };
  for (const auto& [p, u] : d.measured) {
    out += fmt::format("\n[measured.{}]\ntokens = {}\nblock_gflops = {}\nhead_gflops = {}\nembedding_gbs = {:.6g}\n", p,
                       list(u.tokens, 1), list(u.block_flops, 1e9), list(u.head_flops, 1e9),
                       u.embedding_bytes_per_s / 1e9);
    if (u.has_packed())
      out += fmt::format("block_gflops_packed = {}\nhead_gflops_packed = {}\nblock_reorder_ms = {:.6g}\n"
                         "head_reorder_ms = {:.6g}\n",
                         list(u.block_flops_packed, 1e9), list(u.head_flops_packed, 1e9), u.block_reorder_s * 1e3,
                         u.head_reorder_s * 1e3);
  }
  return out;
}

}  // namespace pipetrain
