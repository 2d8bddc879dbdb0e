// calibrate_cluster() of pipetrain/runtime/calibrate.hpp.
#include "pipetrain/runtime/calibrate.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "pipetrain/core/error.hpp"
#include "pipetrain/core/memory_pool.hpp"
#include "pipetrain/core/tensor.hpp"
#include "pipetrain/plan/cost_model.hpp"
#include "pipetrain/runtime/trainer.hpp"
#include "pipetrain/runtime/product_timing.hpp"
#include "pipetrain/runtime/unit_costs.hpp"
#include "pipetrain/topology/node_memory.hpp"

namespace pipetrain {

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

double mean_over(MPI_Comm comm, double x) {
  int n = 1;
  MPI_Comm_size(comm, &n);
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_SUM, comm);
  return x / n;
}

// The best rate of an n x n x n product in the precision's kernel, FLOP/s.
double gemm_rate(Backend& be, MemoryPool& pool, int n, bool bf16) {
  const int64_t e = static_cast<int64_t>(n) * n;
  Tensor a = Tensor::empty(pool, {e}), b = Tensor::empty(pool, {e}), c = Tensor::empty(pool, {e});
  be.fill(a.f32(), 0.01f, static_cast<size_t>(e));
  be.fill(b.f32(), 0.02f, static_cast<size_t>(e));
  Tensor ah, bh;
  if (bf16) {
    ah = Tensor::empty(pool, {e}, DType::BF16), bh = Tensor::empty(pool, {e}, DType::BF16);
    be.cast_to_bf16(ah.bf16_data(), a.f32(), static_cast<size_t>(e));
    be.cast_to_bf16(bh.bf16_data(), b.f32(), static_cast<size_t>(e));
  }
  double best = 1e300;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t = clock_type::now();
    if (bf16)
      be.gemm_bf16(false, false, n, n, n, 1.0f, ah.bf16_data(), n, bh.bf16_data(), n, 0.0f, c.f32(), n);
    else
      be.gemm(false, false, n, n, n, 1.0f, a.f32(), n, b.f32(), n, 0.0f, c.f32(), n);
    be.stream().synchronize();
    if (rep > 0) best = std::min(best, seconds_since(t));
  }
  return 2.0 * n * n * static_cast<double>(n) / best;
}

// AdamW over n parameters: the bytes it moves (28 per parameter) per second.
double adamw_bandwidth(Backend& be, MemoryPool& pool, int64_t n) {
  Tensor p = Tensor::empty(pool, {n}), g = Tensor::empty(pool, {n}), m = Tensor::empty(pool, {n}),
         v = Tensor::empty(pool, {n});
  for (Tensor* t : {&p, &g, &m, &v}) be.fill(t->f32(), 0.01f, static_cast<size_t>(n));
  double best = 1e300;
  for (int rep = 0; rep < 4; ++rep) {
    const auto t = clock_type::now();
    be.adamw(p.f32(), g.f32(), m.f32(), v.f32(), static_cast<size_t>(n), 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, rep + 1, 1.0f);
    be.stream().synchronize();
    if (rep > 0) best = std::min(best, seconds_since(t));
  }
  return 28.0 * static_cast<double>(n) / best;
}

// Ping-pong between world ranks a and b: {latency, bandwidth} of one direction.
LinkSpec ping_pong(MPI_Comm comm, int a, int b) {
  int me = 0;
  MPI_Comm_rank(comm, &me);
  LinkSpec l;
  std::vector<char> buf(32u << 20);
  auto rounds = [&](size_t bytes, int reps) {
    double best = 1e300;
    for (int rep = 0; rep < reps; ++rep) {
      MPI_Barrier(comm);
      const auto t = clock_type::now();
      if (me == a) {
        MPI_Send(buf.data(), static_cast<int>(bytes), MPI_BYTE, b, 7, comm);
        MPI_Recv(buf.data(), static_cast<int>(bytes), MPI_BYTE, b, 7, comm, MPI_STATUS_IGNORE);
      } else if (me == b) {
        MPI_Recv(buf.data(), static_cast<int>(bytes), MPI_BYTE, a, 7, comm, MPI_STATUS_IGNORE);
        MPI_Send(buf.data(), static_cast<int>(bytes), MPI_BYTE, a, 7, comm);
      }
      best = std::min(best, seconds_since(t) / 2);
    }
    MPI_Bcast(&best, 1, MPI_DOUBLE, a, comm);
    return best;
  };
  l.latency = rounds(8, 50);
  l.bandwidth = static_cast<double>(buf.size()) / std::max(rounds(buf.size(), 5) - l.latency, 1e-9);
  return l;
}

// What a ring all-reduce of 32 MiB reaches per rank of `comm`, by the cost model's formula.
double allreduce_bandwidth(MPI_Comm comm, double latency) {
  int n = 1;
  MPI_Comm_size(comm, &n);
  if (n < 2) return 0;
  std::vector<float> x(8u << 20, 1.0f);
  double best = 1e300;
  for (int rep = 0; rep < 4; ++rep) {
    MPI_Barrier(comm);
    const auto t = clock_type::now();
    MPI_Allreduce(MPI_IN_PLACE, x.data(), static_cast<int>(x.size()), MPI_FLOAT, MPI_SUM, comm);
    double s = seconds_since(t);
    MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, comm);
    if (rep > 0) best = std::min(best, s);
  }
  const double bytes = 4.0 * static_cast<double>(x.size());
  return 2.0 * (n - 1) / n * bytes / std::max(best - 2.0 * (n - 1) * latency, 1e-9);
}

// Each kind of layer at the config's microbatch and at a quarter, half, twice and four
// times its tokens (the planner also tries microbatches larger than the config's).
UnitRates measure_unit_rates(const Config& cfg, Backend& backend, MPI_Comm world, bool bf16,
                             const std::function<void(const std::string&)>& say) {
  const int B = std::max(1, cfg.train.global_batch / std::max(1, cfg.train.microbatches)), T = cfg.train.seq_len;
  auto flops = [&](UnitKind k, int b) {
    const UnitWork w = unit_work(cfg.model, k, 1, b, T);
    return w.f_flops + w.i_flops + w.w_flops;
  };
  // The products run in the libraries the run would choose (runtime.dense_products, timed
  // at each size); the layers are timed with every dense weight in place and, where the
  // node can keep them packed, packed, with the reorders a step then pays: the planner
  // weighs the two for each layout by the rule the trainer applies (plan/product_choice).
  Config in_place = cfg;
  in_place.runtime.pack_weights = Toggle::Off;
  const bool may_pack = cfg.runtime.pack_weights != Toggle::Off;
  UnitRates r;
  for (const int b : {B / 4, B / 2, B, 2 * B, 4 * B}) {
    if (b < 1 || (!r.tokens.empty() && b * T <= r.tokens.back())) continue;
    const DenseChoice plain = apply_dense_paths(in_place, backend, 1, b * T, 0, world, "");
    const MeasuredUnits u = time_units_here(cfg.model, backend, b, T, bf16 ? DType::BF16 : DType::F32);
    r.tokens.push_back(static_cast<double>(b) * T);
    r.block_flops.push_back(mean_over(world, flops(UnitKind::Block, b) / u.block.total()));
    r.head_flops.push_back(mean_over(world, flops(UnitKind::Head, b) / u.head.total()));
    if (b == B)
      r.embedding_bytes_per_s =
          mean_over(world, unit_work(cfg.model, UnitKind::Embedding, 1, b, T).bytes / u.embedding.total());
    say(fmt::format("  microbatch {} x {}: block {:.1f} GFLOP/s ({:.1f} ms), head {:.1f} GFLOP/s ({:.1f} ms), "
                    "embedding {:.2f} ms",
                    b, T, r.block_flops.back() / 1e9, 1e3 * u.block.total(), r.head_flops.back() / 1e9,
                    1e3 * u.head.total(), 1e3 * u.embedding.total()));
    const bool packs = may_pack && !plain.from.empty() && plain.from.front().times.reorder >= 0 &&
                       (r.tokens.size() == 1 || r.has_packed());  // at every size, or at none
    if (packs) {
      DensePaths packed = plain.paths;
      for (const DenseShapeUse& x : plain.from) packed.packed.push_back(x.shape);
      backend.set_dense_paths(packed);
      const MeasuredUnits p = time_units_here(cfg.model, backend, b, T, bf16 ? DType::BF16 : DType::F32);
      r.block_flops_packed.push_back(mean_over(world, flops(UnitKind::Block, b) / p.block.total()));
      r.head_flops_packed.push_back(mean_over(world, flops(UnitKind::Head, b) / p.head.total()));
      if (b == B) {  // the reorders of one block's weights and of the head's, per step
        const DenseShape head{cfg.model.padded_vocab(), cfg.model.d_model};
        double all = 0;
        for (const DenseShapeUse& x : plain.from) {
          all += x.count * x.scale * x.times.reorder;
          if (x.shape == head) r.head_reorder_s = x.scale * x.times.reorder;
        }
        r.block_reorder_s = std::max(0.0, all - r.head_reorder_s) / cfg.model.n_layer;
      }
      say(fmt::format("  microbatch {} x {}, weights packed: block {:.1f} GFLOP/s, head {:.1f} GFLOP/s", b, T,
                      r.block_flops_packed.back() / 1e9, r.head_flops_packed.back() / 1e9));
    } else if (r.has_packed()) {  // timed at one size and not another: none kept
      r.block_flops_packed.clear(), r.head_flops_packed.clear();
    }
  }
  say(r.has_packed() ? fmt::format("  reorders of packed weights: {:.2f} ms a block, {:.2f} ms the head, per step",
                                   1e3 * r.block_reorder_s, 1e3 * r.head_reorder_s)
                     : std::string("  weights not packed here (runtime.pack_weights, or nothing timed to pack)"));
  return r;
}

}  // namespace

ClusterSpec calibrate_cluster(const Config& cfg, Backend& backend, MPI_Comm world,
                              const std::function<void(const std::string&)>& log) {
  int rank = 0, size = 1, local = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  MPI_Comm node;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  MPI_Comm_size(node, &local);
  int lo = local, hi = local;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_INT, MPI_MIN, world);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_INT, MPI_MAX, world);
  if (lo != hi) fail("plan --calibrate: nodes run different rank counts ({} to {}); start the same number per node", lo, hi);
  auto say = [&](const std::string& s) {
    if (rank == 0 && log) log(s);
  };

  ClusterSpec c;
  c.devices_per_node = local;
  c.nodes = size / local;
  DeviceSpec& d = c.device;
  d.kind = cfg.runtime.device;
  const std::string prec = cfg.train.precision == "bf16" ? "bf16" : "fp32";
  const bool bf16 = prec == "bf16";
  char host[256] = "this machine";
  gethostname(host, sizeof host - 1);
  c.name = fmt::format("{} ({} ranks per node), calibrated by pipetrain plan --calibrate", host, local);
  if (d.kind != "cpu")
    fail("plan --calibrate measures CPU nodes (runtime.device = \"cpu\"); for GPUs start from a cluster file such as "
         "share/pipetrain/inputs/clusters/dgx-h100.toml");
  d.memory_bytes = node_memory_per_rank(world);  // the node's (or the job's cgroup limit) over its ranks
  d.reserve_bytes = std::max(0.1 * d.memory_bytes, std::min(1073741824.0, 0.5 * d.memory_bytes));

  auto pool = MemoryPool::create(backend);
  d.peak_flops[prec] = mean_over(world, gemm_rate(backend, *pool, 2048, bf16));
  d.gemm_efficiency = 1.0;  // the peak above is the rate products reach here
  say(fmt::format("  {} product (2048^3): {:.1f} GFLOP/s per rank", prec, d.peak_flops[prec] / 1e9));
  d.memory_bandwidth = mean_over(world, adamw_bandwidth(backend, *pool, int64_t{8} << 20));
  say(fmt::format("  AdamW: {:.1f} GB/s per rank", d.memory_bandwidth / 1e9));

  d.measured[prec] = measure_unit_rates(cfg, backend, world, bf16, say);

  if (local > 1) {
    c.intra_node = ping_pong(world, 0, 1);  // ranks 0 and 1 share node 0 (ranks fill nodes in order)
    c.intra_node.allreduce_bandwidth = allreduce_bandwidth(node, c.intra_node.latency);
  } else {  // one rank per node: nothing inside a node to measure; the copy rate bounds it
    c.intra_node = {d.memory_bandwidth / 2, 1e-6, 0};
  }
  if (c.nodes > 1) {
    c.inter_node = ping_pong(world, 0, local);
    c.inter_node.allreduce_bandwidth = allreduce_bandwidth(world, c.inter_node.latency);
  } else {  // one node: the planner never crosses nodes; say so by repeating the node's link
    c.inter_node = c.intra_node;
  }
  MPI_Comm_free(&node);
  say(fmt::format("  links: inside a node {:.2f} GB/s, {:.1f} us (all-reduce {:.2f} GB/s); between nodes {:.2f} GB/s, "
                  "{:.1f} us",
                  c.intra_node.bandwidth / 1e9, c.intra_node.latency * 1e6, c.intra_node.ring_bandwidth() / 1e9,
                  c.inter_node.bandwidth / 1e9, c.inter_node.latency * 1e6));
  return c;
}

}  // namespace pipetrain
