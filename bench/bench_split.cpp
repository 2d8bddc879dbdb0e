// How good is parallel.layers_per_stage = "auto"? Measures GPT-2's unit costs on this
// machine (the same measurement the trainer makes), then for pp = 2, 4, 8 simulates the
// 1f1b step of every possible split with those costs and compares the auto split's step
// with the best one (target: within 3%) and with the even split.
//   build/bin/bench_split [--layers 12] [--seq-len 128] [--microbatches 16]
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <functional>
#include <limits>
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

// The simulated 1f1b step of a split; a stage's F is a third of its forward + backward.
double step_of(const ModelConfig& m, const std::vector<int>& blocks, const UnitCosts& c, int microbatches) {
  const int S = static_cast<int>(blocks.size());
  Costs costs;
  for (const auto& u : partition_gpt2(m, S, blocks)) {
    const double t = stage_cost(m, u, c);
    costs.per_stage.push_back({t / 3, 2 * t / 3, t / 3, t / 3});
  }
  return simulate(make_schedule("1f1b", {S, 1, microbatches}), costs).makespan;
}

}  // namespace

int main(int argc, char** argv) {
  pipetrain::select_blas_kernel(argv);  // as pipetrain: a fallback OpenBLAS kernel is replaced first
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rc = 0;
  {
    KokkosSession kokkos(argc, argv);
    int layers = 12, seq_len = 128, microbatches = 16;
    CLI::App app{"auto stage split vs every split, simulated with measured unit costs"};
    app.add_option("--layers", layers);
    app.add_option("--seq-len", seq_len);
    app.add_option("--microbatches", microbatches);
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
          if (const double t = step_of(m, blocks, c, microbatches); t < best) best = t, best_split = blocks;
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
      const double t_auto = step_of(m, automatic, c, microbatches), t_even = step_of(m, even, c, microbatches);
      fmt::print("pp = {}, m = {}: auto [{}] step {:.3f} s = {:.4f} x best [{}] of {} splits ({:.3f} s); even [{}] "
                 "= {:.3f} x best\n",
                 S, microbatches, fmt::join(automatic, ","), t_auto, t_auto / best, fmt::join(best_split, ","), count,
                 best, fmt::join(even, ","), t_even / best);
      if (t_auto > 1.03 * best) rc = 1;
    }
  }
  MPI_Finalize();
  return rc;
}
