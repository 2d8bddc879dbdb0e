// `pipetrain train CONFIG [--set section.key=value]... [--metrics FILE.jsonl]`
#include <mpi.h>

#include <fmt/format.h>

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "pipetrain/app/commands.hpp"
#include "pipetrain/app/run_log.hpp"
#include "pipetrain/backend/backend.hpp"
#include "pipetrain/backend/cuda.hpp"
#include "pipetrain/core/config.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/core/watchdog.hpp"
#include "pipetrain/io/checkpoint.hpp"
#include "pipetrain/model/partition.hpp"
#include "pipetrain/io/token_dataset.hpp"
#include "pipetrain/runtime/resume.hpp"
#include "pipetrain/runtime/trace_writer.hpp"
#include "pipetrain/runtime/trainer.hpp"
#include "pipetrain/schedule/simulate.hpp"
#include "pipetrain/topology/grid.hpp"

namespace pipetrain {

namespace {

struct TrainOptions {
  std::string config;
  std::vector<std::string> overrides;
  std::string metrics;
  std::string trace_dir;
  std::string resume;  // "auto" or a checkpoint file
  std::string init;    // a checkpoint whose weights start a new run
};

// Set by SIGUSR1 / SIGTERM (Slurm's --signal, pre-emption); the ranks agree on it at
// the next step boundary, checkpoint and exit 0.
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) {
  g_stop_signal = sig;
  watchdog::report_on_signal();  // a rank stuck in a wait says where it is
}

// Keeps the hang watchdog running for the scope of a run, also when it ends by an error.
struct WatchdogGuard {
  WatchdogGuard(double timeout_s, int rank) { watchdog::start(timeout_s, rank); }
  ~WatchdogGuard() { watchdog::stop(); }
  WatchdogGuard(const WatchdogGuard&) = delete;
  WatchdogGuard& operator=(const WatchdogGuard&) = delete;
};

constexpr int kTraceSteps = 20;  // steps recorded by --trace (the first ones)

// The backend runtime.device asks for. CUDA runs need a GPU; until the NCCL
// communicator and host-staged checkpoints exist they are single-rank and checkpoint-free.
std::unique_ptr<Backend> make_backend(const Config& cfg, Grid& grid) {
  if (cfg.runtime.device == "cpu") return make_cpu_backend();
  std::string why;
  if (!cuda_available(&why)) fail("{}: runtime.device = \"cuda\": {}", cfg.source, why);
  if (grid.world_size() > 1)
    fail("{}: runtime.device = \"cuda\" runs on one rank in this build (multi-rank GPU runs need the NCCL "
         "communicator)",
         cfg.source);
  if (cfg.checkpoint.every > 0)
    fail("{}: runtime.device = \"cuda\": checkpoints of device memory are not available yet (set "
         "checkpoint.every = 0)",
         cfg.source);
  return make_cuda_backend();
}

std::string human(double x) {
  const char* units[] = {"", "K", "M", "G", "T"};
  int u = 0;
  while (x >= 1000.0 && u < 4) {
    x /= 1000.0;
    ++u;
  }
  return fmt::format("{:.2f}{}", x, units[u]);
}

int run_train(const TrainOptions& opt) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Config cfg = load_config(opt.config, opt.overrides);
  if (!opt.metrics.empty()) cfg.log.metrics = opt.metrics;
  Grid grid(MPI_COMM_WORLD, cfg.parallel, cfg.source);
  WatchdogGuard watchdog_guard(cfg.runtime.timeout_s, rank);

  TokenDataset data(cfg.data.train, cfg.train.seq_len, cfg.model.vocab_size);
  BatchSampler sampler(data, cfg.data.sampling, cfg.train.seed);
  // Validation data (optional): a fixed set, the first eval_batches global batches.
  std::unique_ptr<TokenDataset> val;
  std::unique_ptr<BatchSampler> val_sampler;
  if (!cfg.data.val.empty()) {
    val = std::make_unique<TokenDataset>(cfg.data.val, cfg.train.seq_len, cfg.model.vocab_size);
    val_sampler = std::make_unique<BatchSampler>(*val, "sequential", cfg.train.seed);
  }
  auto backend = make_backend(cfg, grid);
  Trainer trainer(cfg, grid, *backend, [&](int64_t first, int count, int32_t* in, int32_t* tgt) {
    sampler.load(first, count, in, tgt);
  });

  RunLog log(cfg, !opt.resume.empty(), rank);
  const int64_t nparams = trainer.model_params();
  const Schedule& sched = trainer.schedule();
  const SimResult sim = simulate(sched, Costs{});
  const double flops_per_token = gpt2_flops_per_token(cfg.model, nparams, cfg.train.seq_len);
  // Memory estimate of this rank: parameters, gradients and AdamW moments (4 floats per
  // parameter; fewer with ZeRO-1), plus the stashed activations the schedule keeps alive
  // at its peak (measured on the first step, reported from then on).
  double est = static_cast<double>(trainer.params().numel()) * 4.0 * (cfg.parallel.zero1 ? 2.0 + 2.0 / grid.dp() : 4.0);
  {
    const auto units = partition_gpt2(cfg.model, sched.num_stages, cfg.parallel.layers_per_stage);
    double largest = 0;  // the biggest stage this rank holds, times the schedule's peak stash count
    for (int st = 0; st < sched.num_stages; ++st)
      if (sched.stage_to_rank[static_cast<size_t>(st)] == grid.coords().pp) {
        const auto& u = units[static_cast<size_t>(st)];
        largest = std::max(largest, gpt2_stash_bytes(cfg.model, u.first, u.last, grid.tp(),
                                                     trainer.microbatch_size(), cfg.train.seq_len));
      }
    est += largest * sim.peak_inflight[static_cast<size_t>(grid.coords().pp)];
  }
  grid.world().allreduce_max(&est, 1);
  log.line(fmt::format("pipetrain train {}: GPT-2 {} layers, {} heads, d_model {}, {} parameters",
                       cfg.source, cfg.model.n_layer, cfg.model.n_head, cfg.model.d_model, human(nparams)));
  log.line(fmt::format("  data {} tokens ({} windows of {}), {} sampling; {} tokens/step "
                       "({} x {} microbatches x seq {}); backend {}",
                       human(static_cast<double>(data.num_tokens())), data.num_windows(), cfg.train.seq_len,
                       cfg.data.sampling, trainer.tokens_per_step(), trainer.microbatch_size(),
                       cfg.train.microbatches, cfg.train.seq_len, backend->name()));
  log.line(fmt::format("  grid dp {} x pp {} x tp {} ({} ranks); schedule {}: {} stages, {} microbatches, "
                       "simulated bubble {:.1f}% (F=1, B=2); memory estimate {:.0f} MiB per rank (largest)",
                       grid.dp(), grid.pp(), grid.tp(), grid.world_size(), sched.name, sched.num_stages,
                       sched.num_microbatches, 100.0 * sim.bubble_fraction, est / 1048576.0));
  log.run_files(cfg,
                {{"config", cfg.source},
                 {"grid", {{"dp", grid.dp()}, {"pp", grid.pp()}, {"tp", grid.tp()}}},
                 {"world_size", grid.world_size()},
                 {"schedule", sched.name},
                 {"num_stages", sched.num_stages},
                 {"microbatches", sched.num_microbatches},
                 {"model_params", nparams},
                 {"tokens_per_step", trainer.tokens_per_step()},
                 {"flops_per_token", flops_per_token},
                 {"peak_flops", cfg.log.peak_flops},
                 {"simulated_bubble", sim.bubble_fraction}},
                sched, sim);
  // Where to start: a checkpoint (--resume), another run's weights (--init), or step 0.
  int start = 0;
  const auto& ck = cfg.checkpoint;
  if (opt.resume == "auto") {
    const ResumeResult r = resume_newest(trainer, grid, ck.dir, [](const std::string& path, const std::string& why) {
      fmt::print(stderr, "pipetrain: skipping checkpoint {}: {}; trying the previous one\n", path, why);
    });
    start = static_cast<int>(r.step);
    log.line(r.path.empty() ? fmt::format("no checkpoint in {}: starting from step 0", ck.dir)
                            : fmt::format("resumed from {} at step {}", r.path, start));
  } else if (!opt.resume.empty()) {
    start = static_cast<int>(trainer.load_checkpoint(opt.resume, false));
    log.line(fmt::format("resumed from {} at step {}", opt.resume, start));
  } else if (!opt.init.empty()) {
    trainer.load_checkpoint(opt.init, true);
    log.line(fmt::format("initialised the weights from {}", opt.init));
  }
  auto save = [&](int next_step, const char* why) {
    std::error_code ec;
    if (rank == 0) std::filesystem::create_directories(ck.dir, ec);
    MPI_Barrier(MPI_COMM_WORLD);
    const std::string path = checkpoint_path(ck.dir, next_step);
    trainer.save_checkpoint(path, next_step);
    if (rank == 0) {
      update_latest(ck.dir, path);
      prune_checkpoints(ck.dir, ck.keep);
      log.line(fmt::format("saved checkpoint {} ({})", path, why));
    }
    MPI_Barrier(MPI_COMM_WORLD);
  };
  std::signal(SIGUSR1, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);

  const std::string trace_dir = log.trace_dir(opt.trace_dir);
  const bool tracing = !trace_dir.empty();
  // Progress bar only on a terminal, never inside a batch job (mpirun may hand ranks a
  // pseudo-terminal even when its own output goes to a file: log.progress = false).
  const bool tty = rank == 0 && cfg.log.progress && isatty(fileno(stdout)) && !std::getenv("SLURM_JOB_ID") &&
                   !std::getenv("PBS_JOBID");
  const auto t_start = std::chrono::steady_clock::now();
  std::vector<TraceEvent> trace;
  double trace_offset = 0;
  for (int step = start; step < cfg.train.steps; ++step) {
    trainer.set_trace(tracing && step < kTraceSteps);
    const StepMetrics m = trainer.train_step(step);
    const int ev = cfg.train.eval_every;
    double val_loss = -1;
    if (val && ev > 0 && ((step + 1) % ev == 0 || step + 1 == cfg.train.steps))
      val_loss = trainer.evaluate(
          [&](int64_t first, int count, int32_t* in, int32_t* tgt) { val_sampler->load(first, count, in, tgt); }, 0,
          cfg.train.eval_batches * cfg.train.global_batch);
    if (tracing && step < kTraceSteps) {
      // Steps start together (they end in collectives): lay them end to end.
      for (TraceEvent e : trainer.last_stats().events) {
        e.start_s += trace_offset;
        e.step = step;
        trace.push_back(std::move(e));
      }
      trace_offset += m.step_time_s;
    }
    // Peak pooled memory over the ranks; MFU against log.peak_flops per rank.
    double peak_mem = static_cast<double>(trainer.pool().stats().peak_in_use_bytes);
    grid.world().allreduce_max(&peak_mem, 1);
    const double flops = m.tokens_per_s * flops_per_token;
    const double mfu = cfg.log.peak_flops > 0 ? flops / (cfg.log.peak_flops * grid.world_size()) : -1;
    if (m.skipped)
      log.line(fmt::format("step {}: non-finite loss ({}) or gradient norm ({}): update skipped "
                           "(runtime.on_nonfinite = \"skip\")",
                           step, m.loss, m.grad_norm));
    if (step % cfg.log.every == 0 || step == cfg.train.steps - 1 || val_loss >= 0) {
      std::string text = fmt::format(
          "step {:5d}/{} | loss {:.4f}{} | lr {:.3e} | grad norm {:.4f} | {:.0f} tok/s | {} | {:.1f} ms"
          " | bubble {:.1f}% | mem {:.0f} MiB",
          step, cfg.train.steps, m.loss, val_loss >= 0 ? fmt::format(" | val loss {:.4f}", val_loss) : "", m.lr,
          m.grad_norm, m.tokens_per_s,
          mfu >= 0 ? fmt::format("{}FLOP/s, MFU {:.1f}%", human(flops), 100.0 * mfu) : human(flops) + "FLOP/s",
          m.step_time_s * 1e3, 100.0 * m.bubble_fraction, peak_mem / 1048576.0);
      if (tty) {  // a progress bar with ETA, only on a terminal
        const double done = static_cast<double>(step + 1 - start) / std::max(1, cfg.train.steps - start);
        const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
        const int filled = static_cast<int>(done * 20);
        text += fmt::format(" [{:=<{}}{:<{}}] ETA {:.0f} s", "", filled, "", 20 - filled, el / done - el);
      }
      log.line(text);
    }
    nlohmann::json row = {{"step", m.step},
                          {"loss", m.loss},
                          {"lr", m.lr},
                          {"grad_norm", m.grad_norm},
                          {"tokens_per_s", m.tokens_per_s},
                          {"step_time_s", m.step_time_s},
                          {"bubble_fraction", m.bubble_fraction},
                          {"tokens", static_cast<int64_t>(step + 1) * trainer.tokens_per_step()},
                          {"flops_per_s", flops},
                          {"peak_mem_bytes", peak_mem}};
    if (val_loss >= 0) row["val_loss"] = val_loss;
    if (mfu >= 0) row["mfu"] = mfu;
    log.metrics(row);
    // Checkpoint every checkpoint.every steps, at the end, and when a stop signal
    // arrived on any rank (agreed here, at the step boundary).
    int stop = static_cast<int>(g_stop_signal);
    MPI_Allreduce(MPI_IN_PLACE, &stop, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    const int next = step + 1;
    if (stop) {
      save(next, stop == SIGTERM ? "SIGTERM" : "SIGUSR1");
      log.line(fmt::format("stopping after step {} on {}; resume with --resume auto", step,
                           stop == SIGTERM ? "SIGTERM" : "SIGUSR1"));
      return 0;
    }
    if (ck.every > 0 && (next % ck.every == 0 || next == cfg.train.steps)) save(next, "checkpoint.every");
  }
  if (tracing) {
    std::error_code ec;
    if (rank == 0) std::filesystem::create_directories(trace_dir, ec);
    const std::string path = (std::filesystem::path(trace_dir) / "trace.json").string();
    write_chrome_trace(path, trace, MPI_COMM_WORLD);
    log.line(fmt::format("wrote {} (the first {} steps, all ranks)", path, std::min(cfg.train.steps, kTraceSteps)));
  }
  log.line(fmt::format("done: {} steps; peak pooled memory {} MiB on rank 0", cfg.train.steps,
                       trainer.pool().stats().peak_in_use_bytes >> 20));
  return 0;
}

}  // namespace

void add_train_command(CLI::App& app, CommandRunner& runner) {
  auto opt = std::make_shared<TrainOptions>();
  CLI::App* sub = app.add_subcommand("train", "Train a model described by a TOML config");
  sub->add_option("config", opt->config, "TOML config file")->required();
  sub->add_option("--set", opt->overrides, "Override a config key: section.key=value (repeatable)")
      ->allow_extra_args(false);
  sub->add_option("--metrics", opt->metrics, "Write per-step metrics as JSON Lines to FILE");
  sub->add_option("--trace", opt->trace_dir, "Write a Chrome trace of the real execution to DIR/trace.json");
  sub->add_option("--resume", opt->resume,
                  "Continue from a checkpoint: a file, or 'auto' for the newest one in checkpoint.dir that verifies");
  sub->add_option("--init", opt->init, "Start a new run from a checkpoint's weights (optimizer state and step reset)");
  sub->callback([opt, &runner] { runner = [opt] { return run_train(*opt); }; });
}

}  // namespace pipetrain
