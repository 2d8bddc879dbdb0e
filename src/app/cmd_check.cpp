// `pipetrain check CONFIG [--set k=v]... [--ranks N] [--cluster CLUSTER.toml] [--plan auto]`:
// on one process, everything a run of CONFIG on N ranks checks before step 0 that does
// not need the N ranks themselves: the config, the grid for N ranks, the schedule and its
// lowered per-rank program (proven deadlock-free), the data files, and the memory
// estimate per rank against a cluster file or this node. Prints the header lines the
// run will print; any problem is the run's own one-line error, and the exit is non-zero.
// Job scripts run it at submission, so a bad layout fails in seconds, not after the queue.
#include <fmt/format.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <optional>

#include "pipetrain/app/commands.hpp"
#include "pipetrain/app/run_header.hpp"
#include "pipetrain/backend/bf16_products.hpp"
#include "pipetrain/core/config.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/io/data_blend.hpp"
#include "pipetrain/io/token_dataset.hpp"
#include "pipetrain/plan/planner.hpp"
#include "pipetrain/plan/run_plan.hpp"
#include "pipetrain/runtime/trainer.hpp"
#include "pipetrain/schedule/simulate.hpp"
#include "pipetrain/topology/node_memory.hpp"

namespace pipetrain {

namespace {

// MPI guarantees every implementation at least this tag bound; a program valid under it
// is valid under any job's.
constexpr int kMinTagUb = 32767;

struct CheckOptions {
  std::string config, cluster, plan;
  std::vector<std::string> overrides;
  int ranks = 0;           // 0: the config's dp * pp * cp * tp
  int ranks_per_node = 0;  // 0: min(ranks, this node's CPUs)
  bool no_data = false;
  std::string resume, init, metrics, trace;  // `train` options a job script passes along; unused
};

// The config as `train` resolves it for `ranks` ranks (with --plan auto: the planner's
// best layout on the cluster file).
Config resolve(const CheckOptions& o, const std::optional<ClusterSpec>& cluster, int& ranks, std::string& plan_note) {
  if (!o.plan.empty() && o.plan != "auto") fail("--plan: the only plan is 'auto' (got '{}')", o.plan);
  if (o.plan != "auto") {
    Config cfg = load_config(o.config, o.overrides);
    const int grid = static_cast<int>(cfg.parallel.ranks());
    if (ranks == 0) ranks = grid;
    if (ranks != grid)
      fail(
          "{}: parallel.dp * parallel.pp * parallel.cp * parallel.tp = {} * {} * {} * {} = {} ranks, but the job runs "
          "{} (sbatch --ntasks, mpirun -n, --ranks)",
          cfg.source, cfg.parallel.dp, cfg.parallel.pp, cfg.parallel.cp, cfg.parallel.tp, grid, ranks);
    return cfg;
  }
  if (ranks == 0) fail("check --plan auto: say how many ranks the job runs (--ranks N)");
  if (!cluster)
    fail("check --plan auto: the layout for {} ranks comes from the planner; give it the machine (--cluster "
         "CLUSTER.toml; `pipetrain plan {} --calibrate -o CLUSTER.toml` measures one node)",
         ranks, o.config);
  return planned_config(o.config, o.overrides, *cluster, ranks, &plan_note);
}

// Opens the data files as the run will (format, vocabulary, at least one window).
std::string check_data(const Config& cfg) {
  if (!cfg.data.train_weights.empty()) {
    const BlendedSampler blend(cfg.data.train, cfg.data.train_weights, cfg.train.seq_len, cfg.model.vocab_size,
                               cfg.data.respect_documents, cfg.data.sampling, cfg.train.seed, cfg.data.pack_documents);
    return fmt::format("a blend of {} sources", blend.num_sources());
  }
  const TokenDataset train(cfg.data.train, cfg.train.seq_len, cfg.model.vocab_size, cfg.data.respect_documents,
                           cfg.data.pack_documents);
  if (!cfg.data.val.empty())
    TokenDataset(cfg.data.val, cfg.train.seq_len, cfg.model.vocab_size, false, cfg.data.pack_documents);
  return fmt::format("{} tokens ({} windows of {})", train.num_tokens(), train.num_windows(), cfg.train.seq_len);
}

// This node as the planner's machine, for the memory estimate alone: its memory shared by
// the ranks that will run on it. Rates are placeholders (1 FLOP/s, 1 B/s): no step time
// is predicted from them, and the auto split they give is the one by FLOPs.
ClusterSpec this_node(const Config& cfg, int ranks_per_node) {
  ClusterSpec c;
  c.name = "this node";
  c.source = fmt::format("this node, {} ranks on it", ranks_per_node);
  c.devices_per_node = ranks_per_node;
  c.device.kind = "cpu";
  c.device.memory_bytes = node_memory_per_rank(MPI_COMM_SELF) / ranks_per_node;
  c.device.peak_flops[cfg.train.precision] = 1;
  // Whether this CPU multiplies bf16 natively decides which weights keep widened copies
  // (multiplies_bf16: a bf16 rate above the f32 one); the runtime asks the same question.
  if (cfg.train.precision == "bf16" && bf16_products() != Bf16Products::kOnednn) c.device.peak_flops["fp32"] = 1;
  c.device.gemm_efficiency = 1;
  c.device.memory_bandwidth = 1;
  c.intra_node = c.inter_node = LinkSpec{1, 0, 0};
  return c;
}

int run_check(const CheckOptions& o) {
  if (!is_world_rank0()) return 0;  // one process does it all; under mpirun the rest wait
  std::optional<ClusterSpec> cluster;
  if (!o.cluster.empty()) cluster = load_cluster(o.cluster);
  int ranks = o.ranks;
  std::string plan_note;
  const Config cfg = resolve(o, cluster, ranks, plan_note);

  // The schedule and the program every rank will run, proven as the run proves them.
  const RunPlan plan = plan_run(cfg);
  const Schedule& sched = plan.schedule;
  const bool in_order = cfg.runtime.device == "cuda" && cfg.comm.p2p != "mpi";  // NCCL posts in order
  const Program program = build_program(sched, program_recipe(cfg, plan, kMinTagUb, in_order));
  const SimResult sim = simulate(sched, Costs{});
  const std::string data =
      o.no_data ? std::string("not checked (--no-data)") : check_data(cfg);

  // Memory: the planner's estimate for this layout, against the cluster's device or this node.
  const long cpus = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
  const int per_node = o.ranks_per_node > 0 ? o.ranks_per_node : static_cast<int>(std::min<long>(ranks, cpus));
  const bool gpu_unknown = !cluster && cfg.runtime.device != "cpu";
  const ClusterSpec machine = cluster ? *cluster : this_node(cfg, per_node);
  std::optional<Prediction> predicted;
  Layout layout = plan.layout;
  if (cfg.schedule.file.empty()) predicted = predict(cfg, machine, layout);
  const double usable = machine.device.memory_bytes - machine.device.reserve_bytes;

  fmt::print("{}\n", model_line(cfg, static_cast<int64_t>(model_params(cfg.model))));
  fmt::print("  data {}; {} x {} microbatches x seq {}; precision {}\n", data,
             cfg.train.global_batch / (cfg.parallel.dp * cfg.train.microbatches), cfg.train.microbatches,
             cfg.train.seq_len, cfg.train.precision);
  fmt::print("{}\n", grid_line({cfg.parallel, sched.name, sched.num_stages, sched.num_microbatches, sim.bubble_fraction,
                                predicted ? predicted->memory.total() : 0.0,
                                plan.layout.vocab_parallel ? cfg.parallel.vocab_slices() : 0, cfg.model.padded_vocab(),
                                plan.vocab_reason, plan.layout.sequence_parallel}));
  if (const std::string shard = shard_line(cfg, program); !shard.empty()) fmt::print("{}\n", shard);
  if (predicted && cluster) fmt::print("{}\n", plan_line(plan_note, layout, *predicted, *cluster));
  size_t instructions = 0;
  for (const auto& rank_program : program.per_rank) instructions += rank_program.size();
  std::string memory = "not estimated (schedule.file: the planner prices named schedules)";
  if (predicted && gpu_unknown) {
    memory = "not compared (runtime.device = \"cuda\": give --cluster for the GPUs' memory)";
  } else if (predicted) {
    const double need = predicted->memory.total();
    if (need > usable)
      fail("{}: the memory estimate of the largest rank, {:.2f} GiB, exceeds the {:.2f} GiB a rank may use on {} "
           "(more pipeline or tensor parallelism, train.recompute, parallel.zero1 or smaller microbatches would "
           "need less; `pipetrain plan` ranks layouts that fit)",
           cfg.source, need / 1073741824.0, usable / 1073741824.0, machine.source);
    memory = fmt::format("{:.2f} GiB of {:.2f} GiB per rank ({})", need / 1073741824.0, usable / 1073741824.0,
                         machine.source);
  }
  fmt::print("check: ok: {} on {} ranks; the {} program of {} instructions proven for every rank; memory {}\n",
             cfg.source, ranks, sched.name, instructions, memory);
  return 0;
}

}  // namespace

void add_check_command(CLI::App& app, CommandRunner& runner) {
  auto o = std::make_shared<CheckOptions>();
  CLI::App* sub = app.add_subcommand(
      "check", "Check a config for its full grid on one process (config, grid, lowered program, data, memory)");
  sub->add_option("config", o->config, "TOML config file")->required();
  sub->add_option("--set", o->overrides, "Override a config key: section.key=value (repeatable)")
      ->allow_extra_args(false);
  sub->add_option("--ranks", o->ranks, "The job's MPI ranks (default: parallel.dp * pp * cp * tp)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--ranks-per-node", o->ranks_per_node,
                  "Ranks sharing this node's memory, without --cluster (default: min(ranks, CPUs))")
      ->check(CLI::PositiveNumber);
  sub->add_option("--cluster", o->cluster, "CLUSTER.toml: the machine the memory estimate is checked against");
  sub->add_option("--plan", o->plan, "'auto': check the layout the planner picks for --ranks on --cluster");
  sub->add_flag("--no-data", o->no_data, "Do not open the data files (they live elsewhere than here)");
  // What a job script hands `train` as well; accepted so that it can pass the same options.
  sub->add_option("--resume", o->resume, "(train's option; ignored)");
  sub->add_option("--init", o->init, "(train's option; ignored)");
  sub->add_option("--metrics", o->metrics, "(train's option; ignored)");
  sub->add_option("--trace", o->trace, "(train's option; ignored)");
  sub->callback([o, &runner] { runner = [o] { return run_check(*o); }; });
}

}  // namespace pipetrain
