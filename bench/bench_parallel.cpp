// Benchmark: data parallelism (dp = 2) and tensor parallelism (tp = 2) on 2 ranks (one
// core each) against the single-rank run measured in the same job, with the share of
// the step spent blocked in collectives and the page faults a step takes; dp with and
// without the progress thread and with ZeRO-1; dp with glibc's default malloc policy (run
// first, before keep_freed_host_memory(), which every later layout runs under, as
// pipetrain does); dp with the gradients and with the weights sharded too (parallel.shard
// "gradients", "weights": their tokens/s against ZeRO-1's, the peak memory each holds and the
// weight gathers' exposed wait); and the ceiling dp can reach on this machine, "dp, no communication": each
// rank trains its half of the batch alone (the same compute and whole-model update as a
// replica, both cores busy, nothing exchanged). Each layout takes its timed steps in turns with a single-rank run
// (built beside it), and each of its steps is set against the single-rank steps just before and after it: a shared VM's
// speed drifts over minutes, by more than the effects measured.
// --moe: the model is a Llama mixture of experts at GPT-2-small widths (d_model 768, 8
// experts of width 768, top 2, every block) and the layouts dp and dp with expert
// parallelism ("ep": the experts split over the dp ranks, tokens exchanged by all-to-all);
// "ep-dualpipev" and "ep-dualpipev-in-order" run ep under dualpipev (pp = 1: both V stages
// on each rank, 4 microbatches unless --dualpipev-microbatches) with its F&B pairs overlapped and one after the other,
// and give the all-to-all time no computation hid (the exposed part) of each. --balanced-router gives every expert the
// same rows (model.router_force_balance): the steady state a trained router approaches, where a fresh one's load varies
// from layer to layer.
//
//   mpiexec -n 2 --bind-to core build/bin/bench_parallel [--layers 12] [--seq-len 128]
//                                                        [--batch 8] [--steps 5] [--moe]
//                                                        [--shared-experts 0] [--capacity-factor 0]
//                                                        [--vocab 50257] [--balanced-router]
//                                                        [--dualpipev-microbatches 4]
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <memory>
#include <string>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <vector>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/backend/blas_kernel.hpp"
#include "pipetrain/core/malloc_policy.hpp"
#include "pipetrain/core/rng.hpp"
#include "pipetrain/core/runtime_env.hpp"
#include "bench_common.hpp"
#include "pipetrain/runtime/trainer.hpp"
#include "pipetrain/topology/grid.hpp"

using namespace pipetrain;
using bench::median;
using bench::random_tokens;

namespace {

// One layout's trainer (warmed up) and what its timed steps measured.
struct Run {
  std::unique_ptr<Backend> backend = make_cpu_backend();
  Grid grid;
  Trainer trainer;
  std::vector<double> step_s, dp_s, tp_s, exposed_s, exposed_in_pairs_s, max_load, faults, gather_wait_s, phase[4];

  Run(const Config& cfg, MPI_Comm comm)
      : grid(comm, cfg.parallel), trainer(cfg, grid, *backend, random_tokens(cfg.model.vocab_size, cfg.train.seq_len)) {
    trainer.train_step(0);
  }
  // This step's time (the slowest rank's, as the trainer reports it; a trainer on
  // MPI_COMM_SELF reports its own, so the slowest is taken over the world here).
  double step(int s) {
    grid.comm("dp-cp").reset_comm_seconds();
    grid.comm("tp").reset_comm_seconds();
    const double faults_before = bench::minor_faults();
    StepMetrics m = trainer.train_step(s);
    faults.push_back(bench::minor_faults() - faults_before);
    MPI_Allreduce(MPI_IN_PLACE, &m.step_time_s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    step_s.push_back(m.step_time_s);
    gather_wait_s.push_back(m.gather_wait_s);
    const double ph[4] = {m.phases.program_s, m.phases.reduce_s, m.phases.norm_s, m.phases.optimizer_s};
    for (int k = 0; k < 4; ++k) phase[k].push_back(ph[k]);
    dp_s.push_back(grid.comm("dp-cp").comm_seconds());
    tp_s.push_back(grid.comm("tp").comm_seconds());
    exposed_s.push_back(trainer.last_stats().exchange_wait_s);
    exposed_in_pairs_s.push_back(trainer.last_stats().pair_exchange_wait_s);
    max_load.push_back(m.moe_max_load.empty() ? 0.0 : *std::max_element(m.moe_max_load.begin(), m.moe_max_load.end()));
    return m.step_time_s;
  }
};

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
    int layers = 12, seq_len = 128, batch = 8, steps = 5, shared_experts = 0, dualpipev_microbatches = 4;
    double capacity_factor = 0;
    int vocab = 0;
    // Command-line names of the layouts, in the order they run.
    const std::vector<std::pair<std::string, std::string>> all = {
        {"dp-returns-memory", "dp, glibc's malloc policy"},
        {"dp", "dp"},
        {"dp-no-progress", "dp, no progress thread"},
        {"zero1", "dp, ZeRO-1"},
        {"shard-gradients", "dp, shard gradients"},
        {"shard-weights", "dp, shard weights"},
        {"dp-no-comm", "dp, no communication"},
        {"tp", "tp"},
        {"tp-no-sp", "tp, no sequence parallelism"},
        {"ep", "dp with ep"},
        {"ep-dualpipev", "dp with ep, dualpipev"},
        {"ep-dualpipev-in-order", "dp with ep, dualpipev in order"}};
    std::vector<std::string> only;
    bool moe = false;
    CLI::App app{"dp = 2 and tp = 2 vs a single rank, with the collectives' share of the step"};
    app.add_option("--layers", layers);
    app.add_option("--seq-len", seq_len);
    app.add_option("--batch", batch, "global batch in sequences");
    app.add_option("--steps", steps, "timed steps of each layout (each between two single-rank steps)");
    app.add_option("--layouts", only,
                   "only these layouts: dp-returns-memory, dp, dp-no-progress, zero1, shard-gradients, shard-weights, "
                   "dp-no-comm, tp, tp-no-sp, ep, "
                   "ep-dualpipev, "
                   "ep-dualpipev-in-order (default: all but the ep ones; with --moe: dp and the ep ones)")
        ->check(CLI::IsMember({"dp-returns-memory", "dp", "dp-no-progress", "zero1", "shard-gradients", "shard-weights",
                               "dp-no-comm", "tp", "tp-no-sp", "ep", "ep-dualpipev", "ep-dualpipev-in-order"}));
    app.add_flag("--moe", moe, "a mixture-of-experts Llama; layouts dp and the ep ones");
    app.add_option("--shared-experts", shared_experts, "--moe: always-on experts of width 768 beside the routed ones");
    app.add_option("--dualpipev-microbatches", dualpipev_microbatches,
                   "microbatches of the ep-dualpipev layouts (each replica's share of the batch)");
    app.add_option("--capacity-factor", capacity_factor,
                   "--moe: model.capacity_factor (0: dropless); 1 caps every expert at the mean load");
    bool balanced_router = false;
    app.add_flag("--balanced-router", balanced_router,
                 "--moe: model.router_force_balance (every expert the same rows, a trained router's steady state)");
    app.add_option("--vocab", vocab, "model.vocab_size (default: GPT-2's 50 257)");
    if (auto rc = bench::parse_args(app, argc, argv)) return *rc;
    if (batch % size != 0) {
      if (rank == 0) fmt::print(stderr, "--batch {} must be a multiple of the {} ranks\n", batch, size);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    set_blas_threads(1);
    Config cfg;
    cfg.model.n_layer = layers;
    if (vocab > 0) cfg.model.vocab_size = vocab;
    cfg.model.max_seq_len = std::max(1024, seq_len);
    cfg.train.seq_len = seq_len;
    cfg.train.global_batch = batch;
    cfg.train.microbatches = 1;
    cfg.train.steps = steps + 2;  // the single-rank run: a warm-up, then one before each layout step and one after the last
    if (moe) {
      cfg.model.arch = "llama";
      cfg.model.tie_embeddings = false;
      cfg.model.n_experts = 8;
      cfg.model.top_k = 2;
      cfg.model.expert_ffn_hidden = 768;
      cfg.model.n_shared_experts = shared_experts;
      cfg.model.capacity_factor = capacity_factor;
      cfg.model.router_force_balance = balanced_router;
      if (only.empty()) only = {"dp", "ep", "ep-dualpipev", "ep-dualpipev-in-order"};
    } else if (only.empty()) {
      for (const auto& [flag, kind] : all)
        if (flag.substr(0, 2) != "ep") only.push_back(flag);
    }
    const double tokens = static_cast<double>(batch) * seq_len;
    if (rank == 0)
      fmt::print("{} {} layers, d_model 768, global batch {} x {} tokens; BLAS {}, 1 thread/rank\n",
                 moe ? fmt::format("Llama, a mixture of 8 experts of width 768 (top 2){} in every block,",
                                   shared_experts > 0 ? fmt::format(" and {} shared", shared_experts) : "")
                     : "GPT-2",
                 layers, batch, seq_len, blas_kernel_name());
    // dp with the reducer's progress thread (comm.progress_us = 1000, the default), without
    // it, and with ZeRO-1 (buckets reduced to their owners, the update sharded); then tp.
    std::vector<double> singles;  // this rank's single-rank steps, every round of every layout
    bool policy_set = false;      // keep_freed_host_memory(), once glibc's own policy is measured
    for (const auto& [flag, kind] : all) {
      if (std::find(only.begin(), only.end(), flag) == only.end()) continue;
      // glibc's own policy only for the layout that measures it, the first; the rest as pipetrain.
      if (flag != "dp-returns-memory" && !policy_set) {
        keep_freed_host_memory();
        policy_set = true;
      }
      Config c = cfg;
      (kind[0] == 'd' ? c.parallel.dp : c.parallel.tp) = size;
      if (kind == "dp, no progress thread" || kind[0] == 't') c.comm.progress_us = 0;
      if (kind == "tp, no sequence parallelism") c.parallel.sequence_parallel = Toggle::Off;
      c.parallel.zero1 = kind == "dp, ZeRO-1";
      if (flag.substr(0, 6) == "shard-") c.parallel.shard = flag.substr(6);
      if (flag.substr(0, 2) == "ep") c.parallel.ep = size;
      if (flag.substr(0, 3) == "ep-") {  // V placement on one pipeline rank: dualpipev's pairs from the start
        c.schedule.name = "dualpipev";
        c.parallel.virtual_stages = 2;
        c.train.microbatches = dualpipev_microbatches;
        c.schedule.overlap = flag == "ep-dualpipev";
      }

      const bool alone = kind == "dp, no communication";
      if (alone) {  // one replica's share of the batch, on its own
        c.parallel.dp = 1;
        c.train.global_batch = batch / size;
      }
      // The single-rank run goes on every rank at once (both cores busy, as in the layout).
      Run single(cfg, MPI_COMM_SELF), layout(c, alone ? MPI_COMM_SELF : MPI_COMM_WORLD);
      // Single-rank steps bracket the layout's (S L S L ... S): each layout step is set
      // against the mean of the single-rank steps just before and after it.
      std::vector<double> ratios, one_s;
      auto single_step = [&](int s) {
        singles.push_back(single.step(s));
        one_s.push_back(bench::mean_over_ranks(singles.back()));
        return one_s.back();
      };
      double before = single_step(1);
      for (int s = 1; s <= steps; ++s) {
        const double step = layout.step(s), after = single_step(s + 1);
        ratios.push_back(0.5 * (before + after) / step);
        before = after;
      }
      double comm = alone ? 0.0 : median(kind[0] == 'd' ? layout.dp_s : layout.tp_s);
      // The experts' all-to-alls: blocked in them, the part no computation hid, and of that the part in F&B pairs.
      double exchange[2] = {median(layout.exposed_s), median(layout.exposed_in_pairs_s)}, least[2];
      MPI_Allreduce(exchange, least, 2, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
      MPI_Allreduce(MPI_IN_PLACE, exchange, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      MPI_Allreduce(MPI_IN_PLACE, &comm, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      double faults[2] = {median(layout.faults), median(single.faults)};
      MPI_Allreduce(MPI_IN_PLACE, faults, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      const double t = median(layout.step_s);
      if (rank == 0)
        fmt::print("{} = {}: {:.3f} s/step, {:.0f} tokens/s (single rank in the same run {:.3f} s); each step against "
                   "the single-rank steps around it: median {:.2f} x single rank (steps: {:.2f}); blocked in {} "
                   "collectives {:.3f} s = {:.1f}% of the step; page faults a step (median, the rank with most) {:.0f}, "
                   "single rank {:.0f}\n",
                   kind, size, t, tokens / t, median(one_s), median(ratios), fmt::join(ratios, ", "),
                   kind.substr(0, 2), comm, 100.0 * comm / t, faults[0], faults[1]);
      if (rank == 0 && flag.substr(0, 2) == "ep")
        fmt::print(
            "  blocked on the experts' all-to-alls with no computation beside them (exposed): {:.3f} s = {:.1f}% of "
            "the step ({:.3f} s on the rank with least), in F&B pairs {:.3f} s ({:.3f} s); medians of the steps; "
            "the busiest expert over the mean (the worst layer) {:.2f}\n",
            exchange[0], 100.0 * exchange[0] / t, least[0], exchange[1], least[1], median(layout.max_load));
      if (kind[0] == 't' || flag == "zero1" || flag.substr(0, 6) == "shard-") {  // what each layout holds
        double peak = layout.trainer.peak_memory_bytes(), waited = median(layout.gather_wait_s);
        MPI_Allreduce(MPI_IN_PLACE, &peak, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, &waited, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (rank == 0 && flag == "shard-weights")
          fmt::print(
              "  waited for weight gathers (exposed; median step, the rank with most): {:.3f} s = {:.1f}% of "
              "the step\n",
              waited, 100.0 * waited / t);
        if (rank == 0 && kind[0] != 't')
          fmt::print(
              "  peak memory per rank (pool, packed copies, reductions' scratch; the rank with most): {:.1f} "
              "MiB\n",
              peak / 1048576.0);
      }
      if (kind[0] == 't') {  // sequence parallelism's point: the activations between the tp products
        double peak = layout.trainer.peak_memory_bytes();
        MPI_Allreduce(MPI_IN_PLACE, &peak, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (rank == 0)
          fmt::print("  peak memory per rank (pool and packed copies; the rank with most): {:.1f} MiB\n",
                     peak / 1048576.0);
      }
      bench::print_phases(layout.phase, rank);
    }
    bench::single_rank_mean(median(singles), rank);
  }
  MPI_Finalize();
  return 0;
}
