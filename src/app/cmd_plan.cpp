// `pipetrain plan CONFIG --cluster CLUSTER.toml [--nodes N] [--global-batch B] [--top K] [--json]`
// `pipetrain plan CONFIG --calibrate -o CLUSTER.toml` (under mpirun: measures this machine)
#include <mpi.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>

#include "pipetrain/app/commands.hpp"
#include "pipetrain/backend/backend.hpp"
#include "pipetrain/core/config.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/io/durable_file.hpp"
#include "pipetrain/plan/planner.hpp"
#include "pipetrain/runtime/calibrate.hpp"
#include "pipetrain/runtime/trainer.hpp"

namespace pipetrain {

namespace {

struct PlanCliOptions {
  std::string config, cluster, output;
  std::vector<std::string> overrides, precisions, schedules, recompute;
  std::vector<int> tp, pp, ep, cp, virtual_stages;
  std::string zero1;  // "": both; on | off
  std::vector<std::string> shard;  // parallel.shard levels; empty: --zero1's and the config's
  int nodes = 0, global_batch = 0, top = 5;
  bool json = false, calibrate = false;
};

double gib(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }

nlohmann::json to_json(const Layout& l, const Prediction& p) {
  return {{"dp", l.dp},
          {"pp", l.pp},
          {"tp", l.tp},
          {"ep", l.ep},
          {"cp", l.cp},
          {"sequence_parallel", l.sequence_parallel},
          {"virtual_stages", l.virtual_stages},
          {"schedule", l.pp == 1 ? "none" : l.schedule},
          {"microbatches", l.microbatches},
          {"microbatch_size", l.microbatch_size},
          {"recompute", to_string(l.recompute)},
          {"zero1", l.zero1},
          {"shard", to_string(l.shard)},
          {"shard_reuse", l.shard_keep ? "keep" : "regather"},
          {"shard_prefetch", l.shard_prefetch},
          {"precision", l.precision},
          {"blocks_per_stage", l.blocks_per_stage},
          {"step_s", p.step_s},
          {"tokens_per_s", p.tokens_per_s},
          {"tflops_per_device", p.flops_per_device / 1e12},
          {"mfu", p.mfu},
          {"memory_bytes", p.memory.total()},
          {"breakdown_s",
           {{"compute", p.compute_s},
            {"tp_comm", p.tp_comm_s},
            {"ep_comm", p.ep_comm_s},
            {"cp_comm", p.cp_comm_s},
            {"bubble", p.bubble_s},
            {"dp", p.dp_s},
            {"optimizer", p.optimizer_s},
            {"other", p.other_s}}},
          {"critical_rank", p.critical_rank},
          {"overrides", layout_overrides(l)}};
}

void print_plan(const PlanCliOptions& o, const Config& cfg, const ClusterSpec& cluster, const PlanResult& r,
                double seconds) {
  if (o.json) {
    nlohmann::json j = {{"config", cfg.source},
                        {"cluster", cluster.source},
                        {"devices", r.devices},
                        {"global_batch", r.global_batch},
                        {"seq_len", cfg.train.seq_len},
                        {"candidates", r.candidates},
                        {"pruned_memory", r.pruned_memory},
                        {"simulated", r.simulated},
                        {"usable_memory_bytes", r.usable_memory},
                        {"seconds", seconds},
                        {"reason", r.reason},
                        {"layouts", nlohmann::json::array()}};
    for (const auto& [l, p] : r.ranked) j["layouts"].push_back(to_json(l, p));
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print("pipetrain plan {} on {}{}: {} devices ({} per node), global batch {} x seq {}\n", cfg.source,
             cluster.source, cluster.name.empty() ? "" : " (" + cluster.name + ")", r.devices,
             std::min(cluster.devices_per_node, r.devices), r.global_batch, cfg.train.seq_len);
  fmt::print("  {} layouts: {} pruned for memory (over {:.1f} GiB per device), {} simulated; {:.2f} s\n", r.candidates,
             r.pruned_memory, gib(r.usable_memory), r.simulated, seconds);
  fmt::print("{:>3}  {:<74} {:>10} {:>11} {:>9} {:>6} {:>9}\n", "#", "layout", "step", "tokens/s", "TFLOP/s", "MFU",
             "memory");
  int i = 0;
  for (const auto& [l, p] : r.ranked)
    fmt::print("{:>3}  {:<74} {:>8.1f}ms {:>11.0f} {:>9.3f} {:>5.1f}% {:>5.1f} GiB\n", ++i, describe(l), 1e3 * p.step_s,
               p.tokens_per_s, p.flops_per_device / 1e12, 100 * p.mfu, gib(p.memory.total()));
  const auto& [best, bp] = r.ranked.front();
  fmt::print(
      "best: blocks per stage [{}]; its step: compute {:.1f} ms, tp {:.1f} ms,{}{} bubble {:.1f} ms, dp {:.1f} ms, "
      "AdamW {:.1f} ms, other {:.1f} ms (pipeline rank {})\n",
      fmt::join(best.blocks_per_stage, ", "), 1e3 * bp.compute_s, 1e3 * bp.tp_comm_s,
      best.ep > 1 ? fmt::format(" expert all-to-all {:.1f} ms,", 1e3 * bp.ep_comm_s) : "",
      best.cp > 1 ? fmt::format(" context-parallel ring {:.1f} ms,", 1e3 * bp.cp_comm_s) : "", 1e3 * bp.bubble_s,
      1e3 * bp.dp_s, 1e3 * bp.optimizer_s, 1e3 * bp.other_s, bp.critical_rank);
  if (!r.reason.empty()) fmt::print("why: {}\n", r.reason);
  fmt::print("run it: mpirun -n {} pipetrain train {} --set {}\n", r.devices, cfg.source,
             fmt::join(layout_overrides(best), " --set "));
}

int run_plan(const PlanCliOptions& o) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  // Calibrating measures the config's own layout; planning chooses one.
  Config cfg = load_config(o.config, o.calibrate ? o.overrides : with_planning_layout(o.overrides));
  if (o.calibrate) {
    if (o.output.empty()) fail("plan --calibrate: say where to write the cluster file (-o CLUSTER.toml)");
    auto backend = cfg.runtime.device == "cpu" ? make_cpu_backend() : nullptr;
    if (!backend) fail("plan --calibrate measures CPU nodes (runtime.device = \"cpu\")");
    if (rank == 0) fmt::print("pipetrain plan --calibrate: measuring ({})\n", backend->name());
    const ClusterSpec c = calibrate_cluster(cfg, *backend, MPI_COMM_WORLD, [](const std::string& s) {
      fmt::print("{}\n", s);
      std::fflush(stdout);
    });
    if (rank == 0) {
      write_durably(o.output, [&](std::ostream& out) {
        out << "# Written by pipetrain plan --calibrate " << o.config << "\n" << cluster_to_toml(c);
      });
      fmt::print("wrote {}\n", o.output);
    }
    return 0;
  }
  if (o.cluster.empty()) fail("plan: --cluster CLUSTER.toml is required (or --calibrate -o CLUSTER.toml)");
  if (rank != 0) return 0;  // planning is arithmetic: rank 0 alone
  const ClusterSpec cluster = load_cluster(o.cluster);
  PlanOptions po;
  po.nodes = o.nodes;
  po.global_batch = o.global_batch;
  po.top = o.top;
  po.precisions = o.precisions;
  po.schedules = o.schedules;
  po.only_tp = o.tp;
  po.only_pp = o.pp;
  po.only_ep = o.ep;
  po.only_cp = o.cp;
  po.only_virtual = o.virtual_stages;
  if (!o.recompute.empty()) po.recompute = o.recompute;
  if (!o.zero1.empty()) po.zero1 = {o.zero1 == "on"};
  for (const std::string& level : o.shard) {
    Config c;
    c.parallel.shard = level;
    po.shard.push_back(shard_level(c.parallel));
  }
  po.dp_bucket_mb = cfg.parallel.dp_bucket_mb;
  const auto t0 = std::chrono::steady_clock::now();
  const PlanResult r = plan(cfg, cluster, po);
  print_plan(o, cfg, cluster, r, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return 0;
}

}  // namespace

void add_plan_command(CLI::App& app, CommandRunner& runner) {
  auto o = std::make_shared<PlanCliOptions>();
  CLI::App* sub = app.add_subcommand("plan",
                                     "Rank the layouts (grid, schedule, microbatches, recomputation, ZeRO-1, "
                                     "precision, expert and context parallelism) of a model on a cluster, or measure "
                                     "this machine");
  sub->add_option("config", o->config, "TOML config file (model, train.global_batch, train.seq_len)")->required();
  sub->add_option("--cluster", o->cluster, "The cluster file (CLUSTER.toml)");
  sub->add_option("--nodes", o->nodes, "Nodes to plan for (default: the cluster file's)")->check(CLI::PositiveNumber);
  sub->add_option("--global-batch", o->global_batch, "Sequences per step (default: train.global_batch)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--top", o->top, "Layouts to print (default 5)")->check(CLI::PositiveNumber);
  sub->add_option("--precision", o->precisions, "Only this precision: fp32 | bf16 (repeatable; default: every one "
                                                 "the device lists)");
  sub->add_option("--schedule", o->schedules, "Only this schedule (repeatable; default: every registered one)");
  sub->add_option("--tp", o->tp, "Only this tensor-parallel size (repeatable)");
  sub->add_option("--pp", o->pp, "Only this pipeline size (repeatable)");
  sub->add_option("--ep", o->ep, "Only this expert-parallel size (repeatable; a model with experts)");
  sub->add_option("--cp", o->cp, "Only this context-parallel size (repeatable; long sequences of a dense model)");
  sub->add_option("--virtual-stages", o->virtual_stages, "Only this many stages per pipeline rank (repeatable)");
  sub->add_option("--recompute", o->recompute, "Only this recomputation: none | selective | full (repeatable)")
      ->check(CLI::IsMember({"none", "selective", "full"}));
  sub->add_option("--zero1", o->zero1, "Only with (on) or without (off) ZeRO-1")->check(CLI::IsMember({"on", "off"}));
  sub->add_option("--shard", o->shard,
                  "Only this parallel.shard level (repeatable): none | optimizer | gradients | weights")
      ->check(CLI::IsMember({"none", "optimizer", "gradients", "weights"}));
  sub->add_option("--set", o->overrides, "Override a config key: section.key=value (repeatable)")
      ->allow_extra_args(false);
  sub->add_flag("--json", o->json, "Print the ranking as JSON");
  sub->add_flag("--calibrate", o->calibrate, "Measure this machine (under mpirun: the ranks started) and write -o");
  sub->add_option("-o,--output", o->output, "Where --calibrate writes the cluster file");
  sub->callback([o, &runner] { runner = [o] { return run_plan(*o); }; });
}

}  // namespace pipetrain
