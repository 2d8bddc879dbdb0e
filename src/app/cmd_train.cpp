// `pipetrain train CONFIG [--set section.key=value]... [--metrics FILE.jsonl]`
#include <mpi.h>

#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "pipetrain/app/commands.hpp"
#include "pipetrain/backend/backend.hpp"
#include "pipetrain/core/config.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/io/token_dataset.hpp"
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
};

constexpr int kTraceSteps = 20;  // steps recorded by --trace (the first ones)

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

  TokenDataset data(cfg.data.train, cfg.train.seq_len, cfg.model.vocab_size);
  BatchSampler sampler(data, cfg.data.sampling, cfg.train.seed);
  auto backend = make_cpu_backend();
  Trainer trainer(cfg, grid, *backend, [&](int64_t first, int count, int32_t* in, int32_t* tgt) {
    sampler.load(first, count, in, tgt);
  });

  std::ofstream metrics;
  if (rank == 0 && !cfg.log.metrics.empty()) {
    metrics.open(cfg.log.metrics, std::ios::trunc);
    if (!metrics) fail("log.metrics: cannot write {}", cfg.log.metrics);
  }
  const int64_t nparams = trainer.model_params();
  const Schedule& sched = trainer.schedule();
  const SimResult sim = simulate(sched, Costs{});
  if (rank == 0) {
    fmt::print("pipetrain train {}: GPT-2 {} layers, {} heads, d_model {}, {} parameters\n",
               cfg.source, cfg.model.n_layer, cfg.model.n_head, cfg.model.d_model, human(nparams));
    fmt::print("  data {} tokens ({} windows of {}), {} sampling; {} tokens/step "
               "({} x {} microbatches x seq {}); backend {}\n",
               human(static_cast<double>(data.num_tokens())), data.num_windows(), cfg.train.seq_len,
               cfg.data.sampling, trainer.tokens_per_step(), trainer.microbatch_size(),
               cfg.train.microbatches, cfg.train.seq_len, backend->name());
    fmt::print("grid dp {} x pp {} x tp {} ({} ranks); schedule {}: {} stages, {} microbatches, "
               "simulated bubble {:.1f}% (F=1, B=2)\n",
               grid.dp(), grid.pp(), grid.tp(), grid.world_size(), sched.name, sched.num_stages,
               sched.num_microbatches, 100.0 * sim.bubble_fraction);
    std::fflush(stdout);
  }
  const bool tracing = !opt.trace_dir.empty();
  std::vector<TraceEvent> trace;
  double trace_offset = 0;
  for (int step = 0; step < cfg.train.steps; ++step) {
    trainer.set_trace(tracing && step < kTraceSteps);
    const StepMetrics m = trainer.train_step(step);
    if (tracing && step < kTraceSteps) {
      // Steps start together (they end in collectives): lay them end to end.
      for (TraceEvent e : trainer.last_stats().events) {
        e.start_s += trace_offset;
        trace.push_back(std::move(e));
      }
      trace_offset += m.step_time_s;
    }
    if (rank != 0) continue;
    if (step % cfg.log.every == 0 || step == cfg.train.steps - 1) {
      fmt::print("step {:5d}/{} | loss {:.4f} | lr {:.3e} | grad norm {:.4f} | {:.0f} tok/s | {:.1f} ms"
                 " | bubble {:.1f}%\n",
                 step, cfg.train.steps, m.loss, m.lr, m.grad_norm, m.tokens_per_s,
                 m.step_time_s * 1e3, 100.0 * m.bubble_fraction);
      std::fflush(stdout);
    }
    if (metrics.is_open()) {
      nlohmann::json j = {{"step", m.step},           {"loss", m.loss},
                          {"lr", m.lr},               {"grad_norm", m.grad_norm},
                          {"tokens_per_s", m.tokens_per_s}, {"step_time_s", m.step_time_s},
                          {"bubble_fraction", m.bubble_fraction}};
      metrics << j.dump() << '\n';
      metrics.flush();
    }
  }
  if (tracing) {
    std::error_code ec;
    if (rank == 0) std::filesystem::create_directories(opt.trace_dir, ec);
    const std::string path = (std::filesystem::path(opt.trace_dir) / "trace.json").string();
    write_chrome_trace(path, trace, MPI_COMM_WORLD);
    if (rank == 0) fmt::print("wrote {} (the first {} steps, all ranks)\n", path, std::min(cfg.train.steps, kTraceSteps));
  }
  if (rank == 0) {
    const PoolStats ps = trainer.pool().stats();
    fmt::print("done: {} steps; peak pooled memory {} MiB\n", cfg.train.steps,
               ps.peak_in_use_bytes >> 20);
  }
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
  sub->callback([opt, &runner] { runner = [opt] { return run_train(*opt); }; });
}

}  // namespace pipetrain
