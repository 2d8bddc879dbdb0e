// Benchmark: data parallelism (dp = 2) and tensor parallelism (tp = 2) on 2 ranks (one
// core each) against the single-rank run measured in the same job, with the share of
// the step spent blocked in collectives; dp with and without the progress thread and
// with ZeRO-1.
//
//   mpiexec -n 2 --bind-to core build/bin/bench_parallel [--layers 12] [--seq-len 128]
//                                                        [--batch 8] [--steps 3]
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <string>
#include <fmt/format.h>
#include <vector>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/backend/blas_kernel.hpp"
#include "pipetrain/core/rng.hpp"
#include "pipetrain/core/runtime_env.hpp"
#include "bench_common.hpp"
#include "pipetrain/runtime/trainer.hpp"
#include "pipetrain/topology/grid.hpp"

using namespace pipetrain;
using bench::median;
using bench::random_tokens;

namespace {

struct Result {
  double step_s = 0, dp_comm_s = 0, tp_comm_s = 0;
};

Result measure(const Config& cfg, MPI_Comm comm, int steps) {
  auto backend = make_cpu_backend();
  Grid grid(comm, cfg.parallel);
  Trainer trainer(cfg, grid, *backend, random_tokens(cfg.model.vocab_size, cfg.train.seq_len));
  trainer.train_step(0);
  std::vector<double> step, dp, tp, phase[4];
  for (int s = 1; s <= steps; ++s) {
    grid.dp_comm().reset_comm_seconds();
    grid.tp_comm().reset_comm_seconds();
    const StepMetrics m = trainer.train_step(s);
    step.push_back(m.step_time_s);
    const double ph[4] = {m.phases.program_s, m.phases.reduce_s, m.phases.norm_s, m.phases.optimizer_s};
    for (int k = 0; k < 4; ++k) phase[k].push_back(ph[k]);
    dp.push_back(grid.dp_comm().comm_seconds());
    tp.push_back(grid.tp_comm().comm_seconds());
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  bench::print_phases(phase, rank);
  return {median(step), median(dp), median(tp)};
}

}  // namespace

int main(int argc, char** argv) {
  pipetrain::select_blas_kernel(argv);  // as pipetrain: a fallback OpenBLAS kernel is replaced first
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);  // as pipetrain: the progress thread
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  {
    KokkosSession kokkos(argc, argv);
    int layers = 12, seq_len = 128, batch = 8, steps = 3;
    CLI::App app{"dp = 2 and tp = 2 vs a single rank, with the collectives' share of the step"};
    app.add_option("--layers", layers);
    app.add_option("--seq-len", seq_len);
    app.add_option("--batch", batch, "global batch in sequences");
    app.add_option("--steps", steps);
    if (auto rc = bench::parse_args(app, argc, argv)) return *rc;
    set_blas_threads(1);
    Config cfg;
    cfg.model.n_layer = layers;
    cfg.model.max_seq_len = std::max(1024, seq_len);
    cfg.train.seq_len = seq_len;
    cfg.train.global_batch = batch;
    cfg.train.microbatches = 1;
    cfg.train.steps = steps + 1;
    const double tokens = static_cast<double>(batch) * seq_len;

    // The single-rank run on every rank at once: both cores busy, as in the parallel runs.
    Result single = measure(cfg, MPI_COMM_SELF, steps);
    if (rank == 0)
      fmt::print("GPT-2 {} layers, d_model 768, global batch {} x {} tokens; BLAS {}, 1 thread/rank\n", layers,
                 batch, seq_len, blas_kernel_name());
    single.step_s = bench::single_rank_mean(single.step_s, rank);
    if (rank == 0) fmt::print("single rank: {:.3f} s/step, {:.0f} tokens/s\n", single.step_s, tokens / single.step_s);
    // dp with the reducer's progress thread (comm.progress_us = 1000, the default), without
    // it, and with ZeRO-1 (buckets reduced to their owners, the update sharded)
    for (const std::string kind : {"dp", "dp, no progress thread", "dp, ZeRO-1", "tp"}) {
      Config c = cfg;
      (kind[0] == 'd' ? c.parallel.dp : c.parallel.tp) = size;
      if (kind == "dp, no progress thread" || kind == "tp") c.comm.progress_us = 0;
      c.parallel.zero1 = kind == "dp, ZeRO-1";
      const Result r = measure(c, MPI_COMM_WORLD, steps);
      double comm = kind[0] == 'd' ? r.dp_comm_s : r.tp_comm_s;
      MPI_Allreduce(MPI_IN_PLACE, &comm, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (rank == 0)
        fmt::print("{} = {}: {:.3f} s/step, {:.0f} tokens/s = {:.2f} x single rank; blocked in {} collectives "
                   "{:.3f} s = {:.1f}% of the step\n",
                   kind, size, r.step_s, tokens / r.step_s, single.step_s / r.step_s, kind.substr(0, 2),
                   comm, 100.0 * comm / r.step_s);
    }
  }
  MPI_Finalize();
  return 0;
}
