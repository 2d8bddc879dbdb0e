// `pipetrain train CONFIG [--set section.key=value]... [--metrics FILE.jsonl]`
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>

#include "pipetrain/app/commands.hpp"
#include "pipetrain/app/run_header.hpp"
#include "pipetrain/app/run_log.hpp"
#include "pipetrain/backend/backend.hpp"
#include "pipetrain/backend/cuda.hpp"
#include "pipetrain/core/config.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/core/watchdog.hpp"
#include "pipetrain/io/batch_sampler.hpp"
#include "pipetrain/io/data_blend.hpp"
#include "pipetrain/io/token_dataset.hpp"
#include "pipetrain/model/partition.hpp"
#include "pipetrain/plan/memory_estimate.hpp"
#include "pipetrain/plan/planner.hpp"
#include "pipetrain/plan/vocab_memory.hpp"
#include "pipetrain/runtime/calibrate.hpp"
#include "pipetrain/runtime/trainer.hpp"
#include "pipetrain/runtime/training_loop.hpp"
#include "pipetrain/schedule/program.hpp"
#include "pipetrain/schedule/simulate.hpp"
#include "pipetrain/topology/grid.hpp"

namespace pipetrain {

namespace {

struct TrainOptions {
  std::string config;
  std::vector<std::string> overrides;
  std::string metrics;
  std::string trace_dir;
  std::string resume;   // "auto" or a checkpoint file
  std::string init;     // a checkpoint whose weights start a new run
  std::string plan;     // "auto": run the planner's best layout for the ranks launched
  std::string cluster;  // CLUSTER.toml: the planner's machine (else --plan auto calibrates)
};

// Keeps the hang watchdog running for the scope of a run, also when it ends by an error.
struct WatchdogGuard {
  WatchdogGuard(double timeout_s, int rank) { watchdog::start(timeout_s, rank); }
  ~WatchdogGuard() { watchdog::stop(); }
  WatchdogGuard(const WatchdogGuard&) = delete;
  WatchdogGuard& operator=(const WatchdogGuard&) = delete;
};

// The backend runtime.device asks for: the CPU, or one GPU per rank (the node-local
// rank's, see make_cuda_backend).
std::unique_ptr<Backend> make_backend(const Config& cfg) {
  if (cfg.runtime.device == "cpu") return make_cpu_backend();
  std::string why;
  if (!cuda_available(&why)) fail("{}: runtime.device = \"cuda\": {}", cfg.source, why);
  return make_cuda_backend();
}

// The config the run uses: the file with --set overrides, or with --plan auto the
// planner's best layout for the ranks launched (its neutral layout first: the file's own
// grid and microbatches are the planner's to choose, not to be checked against the batch).
struct ResolvedConfig {
  Config cfg;
  std::optional<ClusterSpec> cluster;  // --cluster, or calibrated for --plan auto
  std::string plan_note;               // " auto (best of N layouts, ...)" under --plan auto
};

ResolvedConfig resolve_config(const TrainOptions& opt, int world) {
  ResolvedConfig r;
  if (!opt.plan.empty() && opt.plan != "auto") fail("--plan: the only plan is 'auto' (got '{}')", opt.plan);
  r.cfg = load_config(opt.config, opt.plan == "auto" ? with_planning_layout(opt.overrides) : opt.overrides);
  if (!opt.cluster.empty()) r.cluster = load_cluster(opt.cluster);
  if (opt.plan == "auto") {
    if (!r.cluster) {
      auto probe = make_backend(r.cfg);
      r.cluster = calibrate_cluster(r.cfg, *probe, MPI_COMM_WORLD);
      r.cluster->source = "calibrated now";
    }
    r.cfg = planned_config(opt.config, opt.overrides, *r.cluster, world, &r.plan_note);
  }
  if (!opt.metrics.empty()) r.cfg.log.metrics = opt.metrics;
  return r;
}

// The training stream (the files read as one, or a blend of weighted sources) and the
// optional validation set (the first eval_batches global batches).
struct TrainData {
  std::unique_ptr<TokenDataset> data;
  std::unique_ptr<BatchSampler> sampler;
  std::unique_ptr<BlendedSampler> blend;
  std::unique_ptr<TokenDataset> val;
  std::unique_ptr<BatchSampler> val_sampler;

  // The trainer's sources: plain windows, or packed documents' sequences with their
  // positions and counted targets (data.pack_documents).
  BatchSource train_source(const Config& cfg) const {
    auto load = [this](int64_t first, int count, int32_t* in, int32_t* tgt, int32_t* pos) {
      if (blend)
        blend->load(first, count, in, tgt, pos);
      else
        sampler->load(first, count, in, tgt, pos);
    };
    if (!cfg.data.pack_documents)
      return [load](int64_t f, int n, int32_t* in, int32_t* tgt) { load(f, n, in, tgt, nullptr); };
    return BatchSource::packed(load, [this](int64_t first, int count) {
      return blend ? blend->targets(first, count) : sampler->targets(first, count);
    });
  }
  BatchSource validation_source(const Config& cfg) const {
    if (!val_sampler) return {};
    BatchSampler* s = val_sampler.get();
    auto load = [s](int64_t first, int count, int32_t* in, int32_t* tgt, int32_t* pos) {
      s->load(first, count, in, tgt, pos);
    };
    if (!cfg.data.pack_documents)
      return [load](int64_t f, int n, int32_t* in, int32_t* tgt) { load(f, n, in, tgt, nullptr); };
    return BatchSource::packed(load, [s](int64_t first, int count) { return s->targets(first, count); });
  }
  std::string summary(const Config& cfg) const;
};

// "(310 windows of 128)", or for packed documents "(1 203 documents packed into 310
// sequences of 128, 97% of positions filled, 2 longer than seq_len split into pieces)".
std::string windows_summary(const TokenDataset& d) {
  const DocumentPacking* p = d.packing();
  if (!p) return fmt::format("({} windows of {})", d.num_windows(), d.seq_len());
  const double filled =
      static_cast<double>(p->positions_filled()) / (static_cast<double>(p->num_sequences()) * d.seq_len());
  return fmt::format("({} documents packed into {} sequences of {}, {:.0f}% of positions filled{})", p->documents(),
                     p->num_sequences(), d.seq_len(), 100 * filled,
                     p->documents_split()
                         ? fmt::format(", {} longer than seq_len split into pieces", p->documents_split())
                         : std::string());
}

// Collective over the job: packed documents are found by one rank's reading of the files.
TrainData open_data(const Config& cfg) {
  TrainData d;
  if (cfg.data.train_weights.empty()) {
    d.data = std::make_unique<TokenDataset>(cfg.data.train, cfg.train.seq_len, cfg.model.vocab_size,
                                            cfg.data.respect_documents, cfg.data.pack_documents, MPI_COMM_WORLD);
    d.sampler = std::make_unique<BatchSampler>(*d.data, cfg.data.sampling, cfg.train.seed);
  } else {
    d.blend = std::make_unique<BlendedSampler>(cfg.data.train, cfg.data.train_weights, cfg.train.seq_len,
                                               cfg.model.vocab_size, cfg.data.respect_documents, cfg.data.sampling,
                                               cfg.train.seed, cfg.data.pack_documents, MPI_COMM_WORLD);
  }
  if (!cfg.data.val.empty()) {
    d.val = std::make_unique<TokenDataset>(cfg.data.val, cfg.train.seq_len, cfg.model.vocab_size,
                                           cfg.data.respect_documents, cfg.data.pack_documents, MPI_COMM_WORLD);
    d.val_sampler = std::make_unique<BatchSampler>(*d.val, "sequential", cfg.train.seed);
  }
  return d;
}

std::string TrainData::summary(const Config& cfg) const {
  if (!blend)
    return fmt::format("{} tokens {}", data->num_tokens(), windows_summary(*data));
  int64_t tokens = 0, windows = 0;
  for (int k = 0; k < blend->num_sources(); ++k)
    tokens += blend->dataset(k).num_tokens(), windows += blend->dataset(k).num_windows();
  // (each source's windows or packing: the lines of the blend below the header)
  return fmt::format("a blend of {} sources, {} tokens ({} {} of {})", blend->num_sources(), tokens, windows,
                     cfg.data.pack_documents ? "packed sequences" : "windows", cfg.train.seq_len);
}

// The memory estimate of the largest rank (plan/memory_estimate.hpp: the planner's and
// `check`'s, for this run as placed: its split, recomputed stages, packing, receives posted
// ahead and vocabulary slices).
double memory_estimate(const Config& cfg, const Trainer& trainer, const Backend& backend) {
  const RunPlan& plan = trainer.plan();
  const Layout& layout = plan.layout;
  Placement p;
  p.schedule = &plan.schedule;
  p.units = &plan.split;
  p.stage_recompute = plan.stage_recompute;
  p.peaks = peak_stashes(plan.schedule);
  p.packed = plan.packs_weights();
  p.native_bf16 = backend.bf16_products_native();
  p.device_kind = cfg.runtime.device;
  p.recv_lookahead = recv_lookahead(trainer.program_recipe());
  const bool placed = layout.vocab_parallel || !trainer.program().shard_peak.empty();
  return placed_memory(cfg, layout, p, placed ? &trainer.program() : nullptr).total();
}

// The split and each stage's share of the model's cost, and what the split costs the step
// (the schedule with these stages' costs against every stage at their mean).
std::string split_line(const Config& cfg, const Trainer& trainer) {
  const Schedule& sched = trainer.schedule();
  const auto& units = trainer.stage_units();
  const UnitCosts& c = trainer.unit_costs();
  std::vector<double> times;  // each stage's forward + backward per microbatch
  for (const auto& u : units) times.push_back(stage_cost(cfg.model, u, c));
  const double total = std::accumulate(times.begin(), times.end(), 0.0);
  std::vector<std::string> shares;
  for (const double t : times) shares.push_back(fmt::format("{:.0f}%", 100.0 * t / total));
  const std::vector<double> even(units.size(), total / static_cast<double>(units.size()));
  const SimResult with_split = simulate(sched, Costs::from_stage_times(times));
  const bool automatic = cfg.parallel.layers_per_stage.empty();
  return fmt::format(
      "  split: blocks per stage [{}] ({}); predicted share of the step per stage {}; simulated "
      "with these costs: bubble {:.1f}%, step {:.3f} x that of stages of equal cost",
      fmt::join(blocks_per_stage(cfg.model, units), ", "),
      automatic ? fmt::format("auto, measured per microbatch: embedding {:.2f} ms, block {:.2f} ms "
                              "(attention half {:.0f}%), head {:.2f} ms",
                              1e3 * c.embedding, 1e3 * c.block, 100.0 * c.attention_share, 1e3 * c.head)
                : std::string("parallel.layers_per_stage"),
      fmt::join(shares, " "), 100.0 * with_split.bubble_fraction,
      with_split.makespan / simulate(sched, Costs::from_stage_times(even)).makespan);
}

// "step N/M | loss ... | mem ..." and, on a terminal, a progress bar with ETA.
std::string step_text(const Config& cfg, const StepRecord& r, int start, bool tty,
                      std::chrono::steady_clock::time_point t_start) {
  const StepMetrics& m = r.metrics;
  std::string text = fmt::format(
      "step {:5d}/{} | loss {:.4f}{} | lr {:.3e} | grad norm {:.4f} | {:.0f} tok/s | {} | {:.1f} ms"
      " | bubble {:.1f}% | mem {:.0f} MiB",
      m.step, cfg.train.steps, m.loss, r.val_loss >= 0 ? fmt::format(" | val loss {:.4f}", r.val_loss) : "", m.lr,
      m.grad_norm, m.tokens_per_s,
      r.mfu >= 0 ? fmt::format("{}FLOP/s, MFU {:.1f}%", human(r.flops_per_s), 100.0 * r.mfu)
                 : human(r.flops_per_s) + "FLOP/s",
      m.step_time_s * 1e3, 100.0 * m.bubble_fraction, r.peak_mem_bytes / 1048576.0);
  if (tty) {
    const double done = static_cast<double>(m.step + 1 - start) / std::max(1, cfg.train.steps - start);
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    const int filled = static_cast<int>(done * 20);
    text += fmt::format(" [{:=<{}}{:<{}}] ETA {:.0f} s", "", filled, "", 20 - filled, el / done - el);
  }
  return text;
}

nlohmann::json metrics_row(const StepRecord& r, const std::optional<Prediction>& predicted) {
  const StepMetrics& m = r.metrics;
  nlohmann::json row = {{"step", m.step},
                        {"loss", m.loss},
                        {"lr", m.lr},
                        {"grad_norm", m.grad_norm},
                        {"tokens_per_s", m.tokens_per_s},
                        {"step_time_s", m.step_time_s},
                        {"bubble_fraction", m.bubble_fraction},
                        {"tokens", r.tokens},
                        {"flops_per_s", r.flops_per_s},
                        {"peak_mem_bytes", r.peak_mem_bytes},
                        {"least_peak_mem_bytes", r.least_peak_mem_bytes},
                        {"reserved_mem_bytes", r.reserved_mem_bytes}};
  if (r.val_loss >= 0) row["val_loss"] = r.val_loss;
  if (predicted) row["predicted_step_time_s"] = predicted->step_s;
  if (r.mfu >= 0) row["mfu"] = r.mfu;
  if (m.moe_load_balance >= 0) {
    row["moe_load_balance_loss"] = m.moe_load_balance;
    row["moe_z_loss"] = m.moe_z;
    row["moe_max_load"] = m.moe_max_load;
    if (!m.moe_dropped.empty()) row["moe_dropped"] = m.moe_dropped;
  }
  return row;
}

// The backend's part of the header: its name, what runtime.dense_products and
// runtime.pack_weights chose and why, and how transfers and dp reductions run.
std::string backend_summary(const Config& cfg, const Trainer& trainer, const Backend& backend) {
  std::string s = backend.name();
  if (!trainer.dense_products().why.empty()) s += fmt::format(" (dense products: {})", trainer.dense_products().why);
  if (cfg.runtime.device != "cpu")
    s += " (transfers: " + trainer.comms_summary() + ")";
  else if (trainer.progress_thread())
    s += fmt::format(", MPI collectives progressed by a thread every {} us", cfg.comm.progress_us);
  return s;
}

// A blend's sources: what each gives over this run's steps.
void log_blend(RunLog& log, const Config& cfg, const TrainData& data) {
  if (!data.blend) return;
  const int64_t samples = static_cast<int64_t>(cfg.train.steps) * cfg.train.global_batch;
  const std::vector<int64_t> n = data.blend->counts(samples);
  for (int k = 0; k < data.blend->num_sources(); ++k)
    log.line(fmt::format(
        "  source {}: {} (weight {:.3f}): {}; {} of the run's {} samples ({:.2f} epochs)", k,
        cfg.data.train[static_cast<size_t>(k)], data.blend->weight(k), windows_summary(data.blend->dataset(k)),
        n[static_cast<size_t>(k)], samples,
        static_cast<double>(n[static_cast<size_t>(k)]) / static_cast<double>(data.blend->dataset(k).num_windows())));
}

// run.json: what this run is (grid, schedule, sizes, the planner's prediction).
nlohmann::json run_info(const Config& cfg, const Grid& grid, const Trainer& trainer, const SimResult& sim,
                        const std::optional<Prediction>& predicted) {
  nlohmann::json info = {
      {"config", cfg.source},
      {"grid", {{"dp", grid.shape().dp}, {"pp", grid.shape().pp}, {"tp", grid.shape().tp}, {"cp", grid.shape().cp}}},
      {"world_size", grid.world_size()},
      {"schedule", trainer.schedule().name},
      {"num_stages", trainer.schedule().num_stages},
      {"microbatches", trainer.schedule().num_microbatches},
      {"model_params", trainer.model_params()},
      {"tokens_per_step", trainer.tokens_per_step()},
      {"flops_per_token", model_flops_per_token(cfg.model, trainer.model_params(), cfg.train.seq_len)},
      {"peak_flops", cfg.log.peak_flops},
      {"simulated_bubble", sim.bubble_fraction},
      {"predicted_step_time_s", predicted ? predicted->step_s : -1.0}};
  return info;
}

// --cluster: the measured median step against the planner's prediction.
void log_step_time(RunLog& log, const std::optional<Prediction>& predicted, std::vector<double> step_times) {
  if (!predicted || step_times.empty()) return;
  std::sort(step_times.begin(), step_times.end());
  const double median = step_times[step_times.size() / 2];
  log.line(
      fmt::format("step time: measured median {:.1f} ms over {} steps, predicted {:.1f} ms (measured / "
                  "predicted {:.3f})",
                  1e3 * median, step_times.size(), 1e3 * predicted->step_s, median / predicted->step_s));
}

int run_train(const TrainOptions& opt) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  ResolvedConfig resolved = resolve_config(opt, world);
  const Config& cfg = resolved.cfg;
  // --cluster: the planner predicts this run's step (not for a schedule file's schedule).
  std::optional<Prediction> predicted;
  Layout layout;
  if (resolved.cluster && cfg.schedule.file.empty()) {
    layout = layout_of(cfg);
    predicted = predict(cfg, *resolved.cluster, layout);
  }
  Grid grid(MPI_COMM_WORLD, cfg.parallel, cfg.source);
  WatchdogGuard watchdog_guard(cfg.runtime.timeout_s, rank);
  const TrainData data = open_data(cfg);
  auto backend = make_backend(cfg);
  Trainer trainer(cfg, grid, *backend, data.train_source(cfg));
  trainer.set_tokenizer(data.blend ? data.blend->dataset(0).tokenizer() : data.data->tokenizer());
  RunLog log(cfg, !opt.resume.empty(), rank);
  const int64_t nparams = trainer.model_params();
  const Schedule& sched = trainer.schedule();
  const SimResult sim = simulate(sched, Costs{});
  const double flops_per_token = model_flops_per_token(cfg.model, nparams, cfg.train.seq_len);
  const double est = memory_estimate(cfg, trainer, *backend);

  log.line(model_line(cfg, nparams));
  log.line(fmt::format(
      "  data {}, {} sampling; {} tokens/step "
      "({} x {} microbatches x seq {}); backend {}; precision {}",
      data.summary(cfg), cfg.data.sampling, trainer.tokens_per_step(), trainer.microbatch_size(),
      cfg.train.microbatches, cfg.train.seq_len, backend_summary(cfg, trainer, *backend), cfg.train.precision));
  log_blend(log, cfg, data);
  log.line(grid_line({grid.shape(), sched.name, sched.num_stages, sched.num_microbatches, sim.bubble_fraction, est,
                      trainer.vocab_parallel() ? grid.shape().vocab_slices() : 0, cfg.model.padded_vocab(),
                      trainer.plan().vocab_reason, trainer.plan().layout.sequence_parallel}));
  if (const std::string shard = shard_line(cfg, trainer.program()); !shard.empty()) log.line(shard);
  if (predicted) log.line(plan_line(resolved.plan_note, layout, *predicted, *resolved.cluster));
  if (sched.num_stages > 1) log.line(split_line(cfg, trainer));
  if (cfg.model.router_force_balance)
    log.line(
        "model.router_force_balance: every expert takes the same rows whatever the router's scores (a benchmark "
        "setting: the routing is not learned)");
  log.run_files(cfg, run_info(cfg, grid, trainer, sim, predicted), sched, sim);
  // Progress bar only on a terminal, never inside a batch job (mpirun may hand ranks a
  // pseudo-terminal even when its own output goes to a file: log.progress = false).
  const bool tty = rank == 0 && cfg.log.progress && isatty(fileno(stdout)) && !std::getenv("SLURM_JOB_ID") &&
                   !std::getenv("PBS_JOBID");
  const auto t_start = std::chrono::steady_clock::now();
  int start = 0;
  LoopOptions lo;
  lo.flops_per_token = flops_per_token;
  lo.trace_dir = log.trace_dir(opt.trace_dir);
  lo.validation = data.validation_source(cfg);
  std::vector<double> step_times;
  LoopSink sink;
  sink.message = [&](const std::string& text) { log.line(text); };
  sink.warning = [&](const std::string& text) {
    if (rank == 0) fmt::print(stderr, "pipetrain: {}\n", text);
  };
  sink.step = [&](const StepRecord& r) {
    const StepMetrics& m = r.metrics;
    if (m.skipped)
      log.line(
          fmt::format("step {}: non-finite loss ({}) or gradient norm ({}): update skipped "
                      "(runtime.on_nonfinite = \"skip\")",
                      m.step, m.loss, m.grad_norm));
    if (r.report) log.line(step_text(cfg, r, start, tty, t_start));
    if (m.step > start) step_times.push_back(m.step_time_s);  // the run's first step warms up
    log.metrics(metrics_row(r, predicted));
  };
  TrainingLoop loop(cfg, trainer, grid, std::move(lo), std::move(sink));
  start = loop.restore(opt.resume, opt.init);
  install_stop_signals();
  if (loop.run(start).stop_signal != 0) return 0;
  log.line(fmt::format("done: {} steps; peak memory {:.0f} MiB on rank 0 (pool and packed weight copies)",
                       cfg.train.steps, trainer.peak_memory_bytes() / 1048576.0));
  log_step_time(log, predicted, step_times);
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
  sub->add_option("--plan", opt->plan,
                  "'auto': run the layout `pipetrain plan` ranks first for the ranks launched (with --cluster, "
                  "or after calibrating this machine)");
  sub->add_option("--cluster", opt->cluster, "CLUSTER.toml: the header and metrics show the planner's prediction");
  sub->callback([opt, &runner] { runner = [opt] { return run_train(*opt); }; });
}

}  // namespace pipetrain
