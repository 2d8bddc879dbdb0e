// Benchmark: pipeline-parallel training on 2 ranks (one core each) against the
// single-rank run measured in the same job, and against simulate() fed with the
// per-action costs measured in the pipelined run itself. The layouts take their timed steps
// in turns, each pipelined step against the single-rank steps just before and after it.
//
//   mpiexec -n 2 build/bin/bench_pipeline [--layers 12] [--seq-len 128] [--microbatches 8]
//                                         [--layers-per-stage 9,3 (default auto)] [--steps 5]
//                                         [--compare-split 9,3 (also this split, steps in turns)]
//                                         [--pack-weights[=auto|true|false] (runtime.pack_weights everywhere; default auto)]
//                                         [--vocab-parallel (also each schedule with the vocabulary split, in turns)]
//                                         [--arch llama --d-model 512 --vocab-size 128256 (a Llama-shaped model, untied)]
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "pipetrain/core/malloc_policy.hpp"
#include "pipetrain/backend/backend.hpp"
#include "pipetrain/backend/blas_kernel.hpp"
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


constexpr const char* kSliceNames[4] = {"EF", "OF", "OB", "EB"};  // VocabOp's order

struct Measured {
  double step_s = 0, exec_s = 0, bubble = 0, sim_makespan = 0, sim_bubble = 0, vs_single = 0;
  // The schedule's own bound on single rank / (p x step) with the measured action costs:
  // every stage at their mean (balanced), and as measured — no tail, no kernel slowdown.
  double bound_balanced = 0, bound_stages = 0;
};

// One layout's trainer and what its timed steps measured.
struct Run {
  Config cfg;
  std::unique_ptr<Backend> backend = make_cpu_backend();
  Grid grid;
  Trainer trainer;
  std::vector<double> step_s, exec_s, bubble, phase[4], compute_s, wait_s, refresh_s, faults;
  std::map<std::pair<int, char>, std::vector<double>> durations;  // (stage, op) -> seconds
  std::vector<double> slices[4];                                  // this rank's EF, OF, OB, EB seconds

  Run(const Config& c, MPI_Comm comm)
      : cfg(c), grid(comm, c.parallel), trainer(c, grid, *backend, random_tokens(c.model.vocab_size, c.train.seq_len)) {
    trainer.train_step(0);  // warm-up
    trainer.set_trace(true);
  }
  double step(int s) {
    const double faults_before = bench::minor_faults();
    const StepMetrics m = trainer.train_step(s);
    faults.push_back(bench::minor_faults() - faults_before);
    double exec = trainer.last_stats().total_s;
    MPI_Allreduce(MPI_IN_PLACE, &exec, 1, MPI_DOUBLE, MPI_MAX, grid.world().comm());
    step_s.push_back(m.step_time_s);
    exec_s.push_back(exec);
    bubble.push_back(m.bubble_fraction);
    compute_s.push_back(trainer.last_stats().compute_s);
    wait_s.push_back(trainer.last_stats().wait_s);
    refresh_s.push_back(trainer.last_stats().refresh_s);
    const double ph[4] = {m.phases.program_s, m.phases.reduce_s, m.phases.norm_s, m.phases.optimizer_s};
    for (int k = 0; k < 4; ++k) phase[k].push_back(ph[k]);
    for (const auto& e : trainer.last_stats().events) {
      for (int k = 0; k < 4; ++k)  // a vocabulary slice: "OF3"
        if (e.name.size() > 2 && e.name.compare(0, 2, kSliceNames[k]) == 0 && std::isdigit(static_cast<unsigned char>(e.name[2])))
          slices[k].push_back(e.dur_s);
      if (e.name.empty() || !std::isdigit(static_cast<unsigned char>(e.name[0]))) continue;  // waits, refreshes
      const auto pos = e.name.find_first_of("FBIW");
      durations[{std::stoi(e.name.substr(0, pos)), e.name[pos]}].push_back(e.dur_s);
    }
    return m.step_time_s;
  }
};

// The pipelined run's figures: per-action costs (medians on the owning rank, summed into
// every rank), simulate() fed with them, and the ratio to the single-rank steps.
Measured summarise(Run& r, const std::vector<double>& ratios, int rank) {
  const Schedule& sched = r.trainer.schedule();
  if (rank == 0)
    fmt::print("  blocks per stage {}\n", fmt::join(blocks_per_stage(r.cfg.model, r.trainer.stage_units()), ","));
  std::vector<double> flat(static_cast<size_t>(sched.num_stages) * 4, 0.0);
  const char ops[4] = {'F', 'B', 'I', 'W'};
  for (int st = 0; st < sched.num_stages; ++st)
    for (int o = 0; o < 4; ++o)
      if (auto it = r.durations.find({st, ops[o]}); it != r.durations.end())
        flat[static_cast<size_t>(st) * 4 + static_cast<size_t>(o)] = median(it->second);
  MPI_Allreduce(MPI_IN_PLACE, flat.data(), static_cast<int>(flat.size()), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  Costs costs;
  for (int st = 0; st < sched.num_stages; ++st) {
    auto* c = &flat[static_cast<size_t>(st) * 4];
    costs.per_stage.push_back({c[0], c[1], c[2], c[3]});
    if (rank == 0)
      fmt::print("  stage {}: F {:.3f} s, B {:.3f} s, I {:.3f} s, W {:.3f} s\n", st, c[0], c[1], c[2], c[3]);
  }
  bench::print_phases(r.phase, rank);
  double cw[4] = {median(r.compute_s), median(r.wait_s), median(r.refresh_s), median(r.faults)}, all[8] = {};
  MPI_Gather(cw, 4, MPI_DOUBLE, all, 4, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  if (rank == 0)
    for (int q = 0; q < 2; ++q)
      fmt::print("  rank {}: computing {:.3f} s{}, waiting {:.3f} s of its program; {:.0f} page faults a step (median)\n",
                 q, all[4 * q],
                 all[4 * q + 2] > 0 ? fmt::format(" (refreshing packed weights while a receive was due {:.3f} s)",
                                                  all[4 * q + 2])
                                    : "",
                 all[4 * q + 1], all[4 * q + 3]);
  // Vocabulary parallelism: every rank's slices (medians, the slowest rank's), and the
  // program with them simulated.
  const Program& prog = r.trainer.program();
  double vocab_work = 0;  // one microbatch's slices on every rank
  if (prog.vocab_parallel) {
    for (int k = 0; k < 4; ++k) costs.vocab[static_cast<size_t>(k)] = median(r.slices[k]);
    MPI_Allreduce(MPI_IN_PLACE, costs.vocab.data(), 4, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    for (double v : costs.vocab) vocab_work += v * prog.num_ranks;
    if (rank == 0)
      fmt::print("  slices per rank: EF {:.4f} s, OF {:.3f} s, OB {:.3f} s, EB {:.4f} s\n", costs.vocab[0], costs.vocab[1],
                 costs.vocab[2], costs.vocab[3]);
  }
  const SimResult sim = prog.vocab_parallel ? simulate_program(prog, costs) : simulate(sched, costs);
  Costs balanced = costs;
  double work = vocab_work * sched.num_microbatches;  // a single rank's program: every action and slice
  double stage_mean = 0;
  for (int o = 0; o < 4; ++o) {
    double mean = 0;
    for (int st = 0; st < sched.num_stages; ++st) mean += flat[static_cast<size_t>(st) * 4 + static_cast<size_t>(o)];
    work += mean * sched.num_microbatches;
    mean /= sched.num_stages;
    stage_mean += mean;
    for (auto& c : balanced.per_stage) c[static_cast<size_t>(o)] = mean;
  }
  // Balanced: the slices' work spread over the stages, each action scaled alike.
  const double spread = stage_mean > 0 ? 1 + vocab_work / sched.num_stages / stage_mean : 1;
  for (auto& c : balanced.per_stage)
    for (double& x : c) x *= spread;
  const double ranks = sched.num_ranks;
  return {median(r.step_s),  median(r.exec_s),  median(r.bubble),
          sim.makespan,      sim.bubble_fraction, median(ratios),
          work / (ranks * simulate(sched, balanced).makespan), work / (ranks * sim.makespan)};
}

}  // namespace

int main(int argc, char** argv) {
  pipetrain::select_blas_kernel(argv);  // as pipetrain: a fallback OpenBLAS kernel is replaced first
  pipetrain::keep_freed_host_memory();  // as pipetrain: freed blocks below 32 MiB reused
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  {
    KokkosSession kokkos(argc, argv);
    int layers = 12, seq_len = 128, microbatches = 8, steps = 5;
    std::vector<double> split;  // empty: parallel.layers_per_stage = "auto" (the default)
    std::vector<double> compare;  // a second split, its steps taken in turns with the first's
    CLI::App app{"pipeline-parallel throughput vs single rank and vs simulate()"};
    app.add_option("--layers", layers);
    app.add_option("--seq-len", seq_len);
    app.add_option("--microbatches", microbatches);
    app.add_option("--layers-per-stage", split, "blocks per stage (default: auto, balanced by measured costs)")
        ->delimiter(',');
    app.add_option("--compare-split", compare, "also run each schedule with these blocks per stage, in turns")
        ->delimiter(',');
    app.add_option("--steps", steps, "timed steps of each schedule (each between two single-rank steps)");
    std::string pack_weights;
    bench::add_pack_weights(app, pack_weights, "in the single rank and the pipelines alike");
    bool vocab = false;
    std::string arch = "gpt2";
    int d_model = 768, vocab_size = 50257;
    app.add_option("--arch", arch, "gpt2, or llama (untied head, 64-wide heads, 2 query heads per key/value head)");
    app.add_option("--d-model", d_model);
    app.add_option("--vocab-size", vocab_size);
    app.add_flag("--vocab-parallel", vocab,
                 "also run each schedule with parallel.vocab_parallel = true (blocks split evenly), in turns");
    if (auto rc = bench::parse_args(app, argc, argv)) return *rc;
    set_blas_threads(1);
    Config cfg;
    cfg.runtime.pack_weights = bench::pack_toggle(pack_weights);
    cfg.model.n_layer = layers;
    cfg.model.arch = arch;
    cfg.model.d_model = d_model;
    cfg.model.n_head = d_model / 64;
    cfg.model.vocab_size = vocab_size;
    if (arch == "llama") {
      cfg.model.n_kv_head = std::max(1, cfg.model.n_head / 2);
      cfg.model.tie_embeddings = false;
    }
    cfg.model.max_seq_len = std::max(1024, seq_len);
    cfg.train.seq_len = seq_len;
    cfg.train.global_batch = microbatches;  // one sequence per microbatch
    cfg.train.microbatches = microbatches;
    cfg.train.steps = 2 * steps + 2;  // the single-rank run's: one warm-up, then one before and after each

    // Every layout built first, then their timed steps taken in turns: a shared VM's speed
    // drifts over minutes. The single-rank run goes on every rank at once (same core count
    // and memory traffic as the pipeline).
    Run single(cfg, MPI_COMM_SELF);
    Config pcfg = cfg;
    pcfg.parallel.pp = size;
    pcfg.parallel.vocab_parallel = Toggle::Off;  // whole layers; the slices are the --vocab-parallel runs
    std::vector<std::unique_ptr<Run>> pipes;
    std::vector<std::string> names, splits;  // each pipe's schedule and split
    std::vector<std::vector<double>> layouts = {split};
    if (!compare.empty()) layouts.push_back(compare);
    for (const auto& blocks : layouts)
      for (const std::string name : {"1f1b", "zb-h1"}) {
        pcfg.schedule.name = name;
        pcfg.parallel.layers_per_stage = blocks;
        pipes.push_back(std::make_unique<Run>(pcfg, MPI_COMM_WORLD));
        names.push_back(name);
        splits.push_back(blocks.empty() ? "auto" : fmt::format("{}", fmt::join(blocks, ",")));
      }
    if (vocab)
      for (const std::string name : {"1f1b", "zb-h1"}) {
        Config v = pcfg;
        v.schedule.name = name;
        v.parallel.layers_per_stage = {};
        v.parallel.vocab_parallel = Toggle::On;
        pipes.push_back(std::make_unique<Run>(v, MPI_COMM_WORLD));
        names.push_back(name + ", vocabulary parallel");
        splits.push_back("auto");
      }
    // Single-rank steps bracket every pipelined step (S P1 S P2 S P1 ...): each pipelined
    // step is set against the mean of the single-rank steps just before and after it, so a
    // drift that is steady over the two cancels.
    std::vector<std::vector<double>> ratios(names.size());
    std::vector<double> singles, mine;
    int single_steps = 0;
    auto single_step = [&] {
      mine.push_back(single.step(++single_steps));
      singles.push_back(bench::mean_over_ranks(mine.back()));
      return singles.back();
    };
    double before = single_step();
    for (int s = 1; s <= steps; ++s)
      for (size_t k = 0; k < pipes.size(); ++k) {
        const double pipelined = pipes[k]->step(s), after = single_step();
        ratios[k].push_back(0.5 * (before + after) / pipelined / size);
        before = after;
      }
    const double single_s = median(singles);
    const double tokens = static_cast<double>(cfg.train.global_batch) * seq_len;
    if (rank == 0)
      fmt::print("{} {} layers, d_model {}, vocabulary {}, seq {}, m = {} microbatches of 1 sequence; BLAS {}, 1 "
                 "thread/rank\nsingle rank: {:.3f} s/step, {:.0f} tokens/s\n",
                 arch == "llama" ? "Llama" : "GPT-2", layers, d_model, vocab_size, seq_len, microbatches,
                 blas_kernel_name(), single_s, tokens / single_s);
    if (rank == 0)
      fmt::print("runtime.pack_weights = {}: the single rank {}{}\n", pack_weights,
                 single.trainer.packs_weights() ? "packs" : "does not pack",
                 single.trainer.dense_products().why.empty() ? "" : " (" + single.trainer.dense_products().why + ")");
    bench::single_rank_mean(median(mine), rank);
    for (size_t k = 0; k < pipes.size(); ++k) {
      if (rank == 0)
        fmt::print("{} on pp = {} (layers per stage {}):\n", names[k], size, splits[k]);
      const Measured m = summarise(*pipes[k], ratios[k], rank);
      if (rank == 0) {
        const double ideal = double(microbatches) / (microbatches + size - 1);
        fmt::print("  step {:.3f} s (executor {:.3f} s); simulate() with measured costs {:.3f} s -> measured/simulated {:.3f}\n"
                   "  bubble measured {:.3f}, simulated {:.3f}; throughput {:.0f} tokens/s; each step against the single-rank "
                   "steps around it, single rank / ({} x this step): median {:.3f} (steps: {:.3f}); 1f1b's m/(m+p-1) = {:.3f}\n"
                   "  this schedule's bound with these action costs (no tail): stages balanced {:.3f}, these stages {:.3f}\n",
                   m.step_s, m.exec_s, m.sim_makespan, m.exec_s / m.sim_makespan, m.bubble, m.sim_bubble,
                   tokens / m.step_s, size, m.vs_single, fmt::join(ratios[k], ", "), ideal, m.bound_balanced,
                   m.bound_stages);
      }
    }
  }
  MPI_Finalize();
  return 0;
}
