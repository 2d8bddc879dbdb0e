// Benchmark: pipeline-parallel training on 2 ranks (one core each) against the
// single-rank run measured in the same job, and against simulate() fed with the
// per-action costs measured in the pipelined run itself.
//
//   mpiexec -n 2 build/bin/bench_pipeline [--layers 12] [--seq-len 128] [--microbatches 8]
//                                         [--layers-per-stage 9,3 (default auto)] [--steps 3]
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <map>
#include <vector>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/core/rng.hpp"
#include "pipetrain/core/runtime_env.hpp"
#include "bench_common.hpp"
#include "pipetrain/runtime/trainer.hpp"
#include "pipetrain/schedule/simulate.hpp"
#include "pipetrain/topology/grid.hpp"

using namespace pipetrain;
using bench::median;
using bench::random_tokens;

namespace {


struct Measured {
  double step_s = 0, exec_s = 0, bubble = 0, sim_makespan = 0, sim_bubble = 0;
};

// Runs `steps` timed steps (after one warm-up) and measures per-action costs.
Measured run_pipeline(Config cfg, int steps, int rank) {
  auto backend = make_cpu_backend();
  Grid grid(MPI_COMM_WORLD, cfg.parallel);
  Trainer trainer(cfg, grid, *backend, random_tokens(cfg.model.vocab_size, cfg.train.seq_len));
  trainer.train_step(0);
  trainer.set_trace(true);
  std::vector<double> step_s, exec_s, bubble, phase[4];
  std::map<std::pair<int, char>, std::vector<double>> durations;  // (stage, op) -> seconds
  for (int s = 1; s <= steps; ++s) {
    const StepMetrics m = trainer.train_step(s);
    double exec = trainer.last_stats().total_s;
    MPI_Allreduce(MPI_IN_PLACE, &exec, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    step_s.push_back(m.step_time_s);
    exec_s.push_back(exec);
    bubble.push_back(m.bubble_fraction);
    const double ph[4] = {m.phases.program_s, m.phases.reduce_s, m.phases.norm_s, m.phases.optimizer_s};
    for (int k = 0; k < 4; ++k) phase[k].push_back(ph[k]);
    for (const auto& e : trainer.last_stats().events) {
      if (e.name.rfind("wait", 0) == 0) continue;
      const auto pos = e.name.find_first_of("FBIW");
      durations[{std::stoi(e.name.substr(0, pos)), e.name[pos]}].push_back(e.dur_s);
    }
  }
  // Per-stage costs {F, B, I, W}: medians on the owning rank, summed into every rank.
  const Schedule& sched = trainer.schedule();
  if (rank == 0) fmt::print("  blocks per stage {}\n", fmt::join(blocks_per_stage(cfg.model, trainer.stage_units()), ","));
  std::vector<double> flat(static_cast<size_t>(sched.num_stages) * 4, 0.0);
  const char ops[4] = {'F', 'B', 'I', 'W'};
  for (int st = 0; st < sched.num_stages; ++st)
    for (int o = 0; o < 4; ++o)
      if (auto it = durations.find({st, ops[o]}); it != durations.end())
        flat[static_cast<size_t>(st) * 4 + static_cast<size_t>(o)] = median(it->second);
  MPI_Allreduce(MPI_IN_PLACE, flat.data(), static_cast<int>(flat.size()), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  Costs costs;
  for (int st = 0; st < sched.num_stages; ++st) {
    auto* c = &flat[static_cast<size_t>(st) * 4];
    costs.per_stage.push_back({c[0], c[1], c[2], c[3]});
    if (rank == 0)
      fmt::print("  stage {}: F {:.3f} s, B {:.3f} s, I {:.3f} s, W {:.3f} s\n", st, c[0], c[1], c[2], c[3]);
  }
  bench::print_phases(phase, rank);
  const SimResult sim = simulate(sched, costs);
  return {median(step_s), median(exec_s), median(bubble), sim.makespan, sim.bubble_fraction};
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  {
    KokkosSession kokkos(argc, argv);
    int layers = 12, seq_len = 128, microbatches = 8, steps = 3;
    std::vector<int> split;  // empty: parallel.layers_per_stage = "auto" (the default)
    CLI::App app{"pipeline-parallel throughput vs single rank and vs simulate()"};
    app.add_option("--layers", layers);
    app.add_option("--seq-len", seq_len);
    app.add_option("--microbatches", microbatches);
    app.add_option("--layers-per-stage", split, "blocks per stage (default: auto, balanced by measured costs)")
        ->delimiter(',');
    app.add_option("--steps", steps);
    if (auto rc = bench::parse_args(app, argc, argv)) return *rc;
    set_blas_threads(1);
    Config cfg;
    cfg.model.n_layer = layers;
    cfg.model.max_seq_len = std::max(1024, seq_len);
    cfg.train.seq_len = seq_len;
    cfg.train.global_batch = microbatches;  // one sequence per microbatch
    cfg.train.microbatches = microbatches;
    cfg.train.steps = steps + 1;

    // Single rank, on every rank at once (same core count and memory traffic as the pipeline).
    double single_s = 0;
    {
      auto backend = make_cpu_backend();
      Grid self(MPI_COMM_SELF, cfg.parallel);
      Trainer t(cfg, self, *backend, random_tokens(cfg.model.vocab_size, seq_len));
      t.train_step(0);
      std::vector<double> times;
      for (int s = 1; s <= steps; ++s) times.push_back(t.train_step(s).step_time_s);
      single_s = median(times);
      MPI_Allreduce(MPI_IN_PLACE, &single_s, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      single_s /= size;
    }
    const double tokens = static_cast<double>(cfg.train.global_batch) * seq_len;
    if (rank == 0)
      fmt::print("GPT-2 {} layers, d_model 768, seq {}, m = {} microbatches of 1 sequence; BLAS {}, 1 thread/rank\n"
                 "single rank: {:.3f} s/step, {:.0f} tokens/s\n",
                 layers, seq_len, microbatches, blas_kernel_name(), single_s, tokens / single_s);
    cfg.parallel.pp = size;
    cfg.parallel.layers_per_stage = split;
    for (const char* name : {"1f1b", "zb-h1"}) {
      cfg.schedule.name = name;
      if (rank == 0)
        fmt::print("{} on pp = {} (layers per stage {}):\n", name, size, split.empty() ? "auto" : fmt::format("{}", fmt::join(split, ",")));
      const Measured m = run_pipeline(cfg, steps, rank);
      if (rank == 0) {
        const double ideal = double(microbatches) / (microbatches + size - 1);
        fmt::print("  step {:.3f} s (executor {:.3f} s); simulate() with measured costs {:.3f} s -> measured/simulated {:.3f}\n"
                   "  bubble measured {:.3f}, simulated {:.3f}; throughput {:.0f} tokens/s = {:.3f} x ({} x single rank); "
                   "theory m/(m+p-1) = {:.3f}\n",
                   m.step_s, m.exec_s, m.sim_makespan, m.exec_s / m.sim_makespan, m.bubble, m.sim_bubble,
                   tokens / m.step_s, single_s / m.step_s / size, size, ideal);
      }
    }
  }
  MPI_Finalize();
  return 0;
}
