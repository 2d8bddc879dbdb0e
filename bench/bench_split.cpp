// How good is parallel.layers_per_stage = "auto"? Measures GPT-2's unit costs on this
// machine (the same measurement the trainer makes), then for pp = 2, 4, 8 simulates the
// 1f1b step of every possible split with those costs and compares the auto split's step
// with the best one (target: within 3%) and with the even split; for pp = 2, 4 also what
// boundaries inside blocks (between attention and MLP) would buy.
//   build/bin/bench_split [--layers 12] [--seq-len 128] [--microbatches 16] [--schedule 1f1b]
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "pipetrain/backend/backend.hpp"
#include "pipetrain/backend/blas_kernel.hpp"
#include "pipetrain/core/runtime_env.hpp"
#include "pipetrain/model/partition.hpp"
#include "pipetrain/runtime/unit_costs.hpp"
#include "pipetrain/schedule/registry.hpp"
#include "pipetrain/schedule/simulate.hpp"
#include "pipetrain/topology/grid.hpp"

using namespace pipetrain;

namespace {

// The schedule simulated and its microbatches.
struct Sim {
  std::string schedule = "1f1b";
  int microbatches = 16;
};

// The simulated step of stages costing `stage_costs` per microbatch (forward + backward).
double step_of_costs(const std::vector<double>& stage_costs, const Sim& sim) {
  const int S = static_cast<int>(stage_costs.size());
  return simulate(make_schedule(sim.schedule, {S, 1, sim.microbatches}), Costs::from_stage_times(stage_costs))
      .makespan;
}

double step_of(const ModelConfig& m, const std::vector<int>& blocks, const UnitCosts& c, const Sim& sim) {
  std::vector<double> t;
  for (const auto& u : partition_gpt2(m, static_cast<int>(blocks.size()), blocks)) t.push_back(stage_cost(m, u, c));
  return step_of_costs(t, sim);
}

// What a finer split would buy: stage boundaries also between a block's attention half
// (LayerNorm, QKV, attention, projection) and its MLP half. Not a layout pipetrain runs:
// the halves' costs are the measured block's, shared by the halves' forward FLOPs per token
// (attention 8C² + 2TC for the causal scores and values, MLP 16C²). Returns the best
// simulated step and its stages' sizes in blocks (halves as .5).
std::pair<double, std::vector<double>> best_with_halves(const ModelConfig& m, int S, const UnitCosts& c, int T,
                                                        const Sim& sim) {
  const double C = m.d_model, attn = 8 * C * C + 2.0 * T * C, mlp = 16 * C * C;
  const double a = c.block * attn / (attn + mlp), b = c.block - a;
  const int halves = 2 * m.n_layer;
  double best = std::numeric_limits<double>::infinity();
  std::vector<double> best_sizes, sizes(static_cast<size_t>(S)), cost(static_cast<size_t>(S));
  // Stage s takes halves [at, at + k): half h is attention when h is even.
  std::function<void(int, int)> go = [&](int s, int at) {
    const bool last = s == S - 1;
    // Middle stages take at least one half; the first and the last may take none.
    for (int k = last ? halves - at : (s == 0 ? 0 : 1); k <= halves - at - std::max(0, S - 2 - s); ++k) {
      double t = (s == 0 ? c.embedding : 0) + (last ? c.head : 0);
      for (int h = at; h < at + k; ++h) t += h % 2 == 0 ? a : b;
      cost[static_cast<size_t>(s)] = t;
      sizes[static_cast<size_t>(s)] = k / 2.0;
      if (!last) {
        go(s + 1, at + k);
      } else if (const double step = step_of_costs(cost, sim); step < best) {
        best = step, best_sizes = sizes;
      }
    }
  };
  go(0, 0);
  return {best, best_sizes};
}

}  // namespace

int main(int argc, char** argv) {
  pipetrain::select_blas_kernel(argv);  // as pipetrain: a fallback OpenBLAS kernel is replaced first
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rc = 0;
  {
    KokkosSession kokkos(argc, argv);
    int layers = 12, seq_len = 128;
    Sim sim;
    CLI::App app{"auto stage split vs every split, simulated with measured unit costs"};
    app.add_option("--layers", layers);
    app.add_option("--seq-len", seq_len);
    app.add_option("--microbatches", sim.microbatches);
    app.add_option("--schedule", sim.schedule, "the schedule simulated (one stage per rank)");
    if (auto r = bench::parse_args(app, argc, argv)) return *r;
    set_blas_threads(1);
    ModelConfig m;
    m.n_layer = layers;
    m.max_seq_len = std::max(1024, seq_len);
    auto backend = make_cpu_backend();
    ParallelConfig one;
    Grid grid(MPI_COMM_SELF, one);
    const UnitCosts c = measure_unit_costs(m, *backend, grid, 1, seq_len, DType::F32);
    fmt::print("GPT-2 {} layers, d_model {}, vocab {}, seq {}; BLAS {}, 1 thread\n", layers, m.d_model, m.vocab_size,
               seq_len, blas_kernel_name());
    fmt::print("measured per microbatch (forward + backward): embedding {:.2f} ms, block {:.2f} ms, head {:.2f} ms "
               "(head = {:.2f} blocks)\n",
               1e3 * c.embedding, 1e3 * c.block, 1e3 * c.head, c.head / c.block);
    for (int S : {2, 4, 8}) {
      if (S - 2 > layers) continue;
      double best = std::numeric_limits<double>::infinity();
      std::vector<int> best_split, blocks(static_cast<size_t>(S));
      long count = 0;
      std::function<void(int, int)> go = [&](int s, int left) {
        if (s == S - 1) {
          blocks[static_cast<size_t>(s)] = left;
          ++count;
          if (const double t = step_of(m, blocks, c, sim); t < best) best = t, best_split = blocks;
          return;
        }
        for (int k = (s == 0 ? 0 : 1); k <= left; ++k) {
          blocks[static_cast<size_t>(s)] = k;
          go(s + 1, left - k);
        }
      };
      go(0, layers);
      const std::vector<int> automatic = balanced_blocks(m, S, c);
      std::vector<int> even;
      for (int s = 0; s < S; ++s) even.push_back(layers / S + (s < layers % S ? 1 : 0));
      const double t_auto = step_of(m, automatic, c, sim), t_even = step_of(m, even, c, sim);
      fmt::print("pp = {}, m = {}: auto [{}] step {:.3f} s = {:.4f} x best [{}] of {} splits ({:.3f} s); even [{}] "
                 "= {:.3f} x best\n",
                 S, sim.microbatches, fmt::join(automatic, ","), t_auto, t_auto / best, fmt::join(best_split, ","), count,
                 best, fmt::join(even, ","), t_even / best);
      if (t_auto > 1.03 * best) rc = 1;
      if (S <= 4) {  // exhaustive over half-block boundaries; pp = 8 would take minutes
        const auto [t_half, sizes] = best_with_halves(m, S, c, seq_len, sim);
        fmt::print("  with attention | MLP boundaries inside blocks too: best [{}] blocks, step {:.3f} s = {:.4f} x the "
                   "whole-block best\n",
                   fmt::join(sizes, ","), t_half, t_half / best);
      }
    }
  }
  MPI_Finalize();
  return rc;
}
