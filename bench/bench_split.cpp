// How good is parallel.layers_per_stage = "auto"? Measures GPT-2's unit costs on this
// machine (the same measurement the trainer makes), then for pp = 2, 4, 8 simulates the
// 1f1b step of every possible split with those costs and compares the auto split's step
// with the best one (target: within 3%) and with the even split; for pp = 2, 4 the best
// also over boundaries inside blocks (between attention and MLP, which auto may choose);
// and the step with the vocabulary spread over every rank (vocab_pieces.hpp), against the
// best split and the balanced bound.
//   build/bin/bench_split [--layers 12] [--seq-len 128] [--microbatches 16] [--schedule 1f1b]
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "pipetrain/backend/backend.hpp"
#include "pipetrain/backend/blas_kernel.hpp"
#include "pipetrain/core/malloc_policy.hpp"
#include "pipetrain/core/runtime_env.hpp"
#include "pipetrain/model/partition.hpp"
#include "pipetrain/runtime/unit_costs.hpp"
#include "pipetrain/schedule/registry.hpp"
#include "pipetrain/schedule/simulate.hpp"
#include "pipetrain/schedule/vocab_pieces.hpp"
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
  return simulate(make_schedule(sim.schedule, {S, 1, sim.microbatches}), Costs::from_stage_times(stage_costs)).makespan;
}

double step_of(const ModelConfig& m, const std::vector<double>& blocks, const UnitCosts& c, const Sim& sim) {
  std::vector<double> t;
  for (const auto& u : partition_stages(m, static_cast<int>(blocks.size()), blocks)) t.push_back(stage_cost(m, u, c));
  return step_of_costs(t, sim);
}

// The best simulated step over every split in steps of `step` halves (2: whole blocks; 1:
// also between a block's attention and MLP halves, priced by the measured attention share),
// its stages' sizes in blocks, and how many splits were tried.
struct Best {
  double step = std::numeric_limits<double>::infinity();
  std::vector<double> split;
  long count = 0;
};
Best best_split(const ModelConfig& m, int S, const UnitCosts& c, int step, const Sim& sim) {
  Best best;
  std::vector<double> blocks(static_cast<size_t>(S));
  std::function<void(int, int)> go = [&](int s, int left) {  // left: halves
    if (s == S - 1) {
      blocks[static_cast<size_t>(s)] = 0.5 * left;
      ++best.count;
      if (const double t = step_of(m, blocks, c, sim); t < best.step) best.step = t, best.split = blocks;
      return;
    }
    // Middle stages take at least one step; the first and the last may take none.
    for (int k = (s == 0 ? 0 : step); k <= left; k += step) {
      blocks[static_cast<size_t>(s)] = 0.5 * k;
      go(s + 1, left - k);
    }
  };
  go(0, 2 * m.n_layer);
  return best;
}

// Vocabulary parallelism (schedule/vocab_pieces.hpp): the blocks split evenly, the
// embedding and the head spread over the S ranks (OF two of the head's three products,
// OB the third; the embedding half forward, half backward), the slices
// placed into the schedule's program. Returns its simulated step and the balanced bound:
// the schedule with every stage carrying an S-th of the whole model.
std::pair<double, double> vocab_parallel_step(const ModelConfig& m, int S, const UnitCosts& c, const Sim& sim) {
  const Schedule s = make_schedule(sim.schedule, {S, 1, sim.microbatches});
  Costs costs = Costs::from_stage_times(std::vector<double>(static_cast<size_t>(S), c.block * m.n_layer / S));
  costs.vocab = {c.embedding / (2 * S), 2 * c.head / (3 * S), c.head / (3 * S), c.embedding / (2 * S)};
  const double step = simulate_program(lower_vocab_parallel(s, {}, costs), costs).makespan;
  const double all = c.embedding + c.block * m.n_layer + c.head;
  return {step, step_of_costs(std::vector<double>(static_cast<size_t>(S), all / S), sim)};
}

}  // namespace

int main(int argc, char** argv) {
  pipetrain::select_blas_kernel(argv);  // as pipetrain: a fallback OpenBLAS kernel is replaced first
  pipetrain::keep_freed_host_memory();  // as pipetrain: freed blocks below 32 MiB reused
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
    fmt::print(
        "measured per microbatch (forward + backward): embedding {:.2f} ms, block {:.2f} ms (attention half "
        "{:.0f}%), head {:.2f} ms (head = {:.2f} blocks)\n",
        1e3 * c.embedding, 1e3 * c.block, 100.0 * c.attention_share, 1e3 * c.head, c.head / c.block);
    for (int S : {2, 4, 8}) {
      if (S - 2 > layers) continue;
      const Best whole = best_split(m, S, c, 2, sim);
      // Exhaustive over half-block boundaries too; pp = 8 would take minutes.
      const Best halves = S <= 4 ? best_split(m, S, c, 1, sim) : whole;
      const Best& best = halves.step < whole.step ? halves : whole;
      const std::vector<double> automatic = balanced_blocks(m, S, c);
      std::vector<double> even;
      for (int s = 0; s < S; ++s) even.push_back(layers / S + (s < layers % S ? 1 : 0));
      const double t_auto = step_of(m, automatic, c, sim), t_even = step_of(m, even, c, sim);
      fmt::print(
          "pp = {}, m = {}: auto [{}] step {:.3f} s = {:.4f} x best [{}] of {} splits ({:.3f} s); best of whole "
          "blocks [{}] = {:.4f} x best; even [{}] = {:.3f} x best\n",
          S, sim.microbatches, fmt::join(automatic, ","), t_auto, t_auto / best.step, fmt::join(best.split, ","),
          (S <= 4 ? halves : whole).count, best.step, fmt::join(whole.split, ","), whole.step / best.step,
          fmt::join(even, ","), t_even / best.step);
      if (t_auto > 1.03 * best.step) rc = 1;
      const auto [t_vocab, balanced] = vocab_parallel_step(m, S, c, sim);
      fmt::print(
          "         vocabulary parallel (blocks even, embedding and head over the {} ranks): step {:.3f} s = "
          "{:.4f} x best split, {:.4f} x the balanced bound ({:.3f} s)\n",
          S, t_vocab, t_vocab / best.step, t_vocab / balanced, balanced);
    }
  }
  MPI_Finalize();
  return rc;
}
