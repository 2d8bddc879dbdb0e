// `pipetrain schedule`: add_schedule_command (declared in pipetrain/app/commands.hpp).
//   pipetrain schedule NAME --ranks R [--stages S] --microbatches M    a built-in
//   pipetrain schedule --file F.csv [--placement loop|v|0,1,1,0]        a schedule file
//     [--costs F,I,W] [--comm T] [--json] [--svg FILE] [--trace FILE] [--csv FILE [--lowered]]
//     [--vocab-parallel [--vocab-costs EF,OF,OB,EB]]
//   pipetrain schedule --list
// Validates the schedule and its lowered program, simulates it and prints the text grid,
// makespan, bubble fraction and peak in-flight activations per rank (or only JSON with
// --json). A --file may be compute-only or compute+comms (a lowered program, run as given). Runs on
// rank 0 only when launched with more ranks; errors throw pipetrain::Error.
#include <fmt/ranges.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "pipetrain/app/commands.hpp"
#include "pipetrain/app/svg_plot.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/schedule/csv.hpp"
#include "pipetrain/schedule/program_builder.hpp"
#include "pipetrain/schedule/program_csv.hpp"
#include "pipetrain/schedule/registry.hpp"
#include "pipetrain/schedule/render.hpp"
#include "pipetrain/schedule/simulate.hpp"
#include "pipetrain/schedule/validate.hpp"
#include "pipetrain/schedule/vocab_pieces.hpp"

namespace pipetrain {
namespace {

// Tags are checked against the smallest MPI_TAG_UB the standard allows (the run checks
// its own MPI's bound).
constexpr int kTagUb = 32767;

struct ScheduleOptions {
  std::string name, file, placement;
  int ranks = 0, stages = 0, microbatches = 0;
  std::string costs = "1,1,1";
  double comm = 0, transfer_bytes = 0, bandwidth = 0;
  bool json = false, list = false, lowered = false, vocab_parallel = false;
  std::string vocab_costs = "0.1,1,2,0.1";
  std::string svg, trace, csv;
  // Sharded data parallelism: the level, each stage's layers (a unit each), the reuse
  // policy, the prefetch and one unit's gather and reduce-scatter times.
  std::string shard, shard_reuse = "regather", shard_costs = "0.25,0.25";
  int shard_layers = 2, shard_prefetch = 1;
};

// --shard-costs G,S.
std::pair<double, double> parse_shard_costs(const std::string& text) {
  double g = -1, sc = -1;
  char comma = 0, rest = 0;
  if (std::sscanf(text.c_str(), "%lf %c %lf %c", &g, &comma, &sc, &rest) != 3 || comma != ',' || !(g >= 0) ||
      !(sc >= 0))
    fail("--shard-costs \"{}\": expected two numbers >= 0 GATHER,REDUCE_SCATTER (e.g. 0.25,0.25)", text);
  return {g, sc};
}

Costs parse_costs(const std::string& text, double comm) {
  std::vector<double> v;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = text.find(',', pos);
    const std::string item = text.substr(pos, comma == std::string::npos ? comma : comma - pos);
    size_t used = 0;
    double x = 0;
    try {
      x = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || item.find_first_not_of(" \t", used) != std::string::npos || !(x > 0))
      fail("--costs \"{}\": expected three positive numbers F,I,W (e.g. 1,1,1)", text);
    v.push_back(x);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  if (v.size() != 3) fail("--costs \"{}\": expected three positive numbers F,I,W (e.g. 1,1,1)", text);
  if (!(comm >= 0)) fail("--comm {}: must be zero or positive", comm);
  Costs c;
  c.F = v[0];
  c.I = v[1];
  c.W = v[2];
  c.B = c.I + c.W;
  c.comm = comm;
  return c;
}

// --vocab-costs EF,OF,OB,EB: one rank's slices per microbatch.
std::array<double, 4> parse_vocab_costs(const std::string& text) {
  std::array<double, 4> v{};
  size_t pos = 0, n = 0;
  const std::string what =
      fmt::format("--vocab-costs \"{}\": expected four numbers >= 0 EF,OF,OB,EB (e.g. 0.1,1,2,0.1)", text);
  for (; n < 4; ++n) {
    const size_t comma = text.find(',', pos);
    const std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t used = 0;
    try {
      v[n] = std::stod(item, &used);
    } catch (const std::exception&) {
      fail("{}", what);
    }
    if (used == 0 || item.find_first_not_of(" \t", used) != std::string::npos || !(v[n] >= 0)) fail("{}", what);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  if (n != 3) fail("{}", what);
  return v;
}

// The schedule to show, and the text of --file when given (it may hold a lowered program).
struct Built {
  Schedule schedule;
  std::string text;
};

Built build(const ScheduleOptions& o) {
  if (!o.name.empty() && !o.file.empty()) fail("schedule: give a schedule NAME or --file, not both");
  if (o.name.empty() && o.file.empty()) fail("schedule: give a schedule NAME (see --list) or --file FILE.csv");
  if (!o.file.empty()) {
    const std::string text = read_schedule_text(o.file), placement = o.placement.empty() ? "loop" : o.placement;
    Schedule s = is_comms_csv(text) ? compute_only(program_from_csv(text, o.file, placement, INT_MAX))
                                    : from_csv(text, o.file, placement);
    if (o.ranks > 0 && o.ranks != s.num_ranks)
      fail("{}: the file has {} ranks (rows) but --ranks is {}", o.file, s.num_ranks, o.ranks);
    if (o.stages > 0 && o.stages != s.num_stages)
      fail("{}: the file has {} stages but --stages is {}", o.file, s.num_stages, o.stages);
    if (o.microbatches > 0 && o.microbatches != s.num_microbatches)
      fail("{}: the file has {} microbatches but --microbatches is {}", o.file, s.num_microbatches, o.microbatches);
    return {s, text};
  }
  if (!o.placement.empty()) fail("--placement applies to --file; built-in schedules choose their own placement");
  if (o.ranks < 1) fail("schedule {}: --ranks must be given and at least 1", o.name);
  if (o.microbatches < 1) fail("schedule {}: --microbatches must be given and at least 1", o.name);
  const int stages = o.stages > 0 ? o.stages : o.ranks;
  if (stages % o.ranks != 0) fail("schedule {}: --stages {} is not a multiple of --ranks {}", o.name, stages, o.ranks);
  return {make_schedule(o.name, ScheduleParams{o.ranks, stages / o.ranks, o.microbatches}), ""};
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  if (!out) fail("{}: cannot open for writing", path);
  out << text;
  out.close();
  if (!out) fail("{}: write failed", path);
}

// --shard: each rank's program with its collectives, its link's timeline, its most units whole.
void print_shard_program(const ScheduleOptions& o, const Program& program, const Costs& costs, const SimResult& r) {
  fmt::print("shard {} ({}, prefetch {}; gather {:g}, reduce-scatter {:g} per unit): the lowered program:\n", o.shard,
             o.shard_reuse, o.shard_prefetch, costs.gather, costs.scatter);
  for (int rank = 0; rank < program.num_ranks; ++rank) {
    std::vector<std::string> cells, link;
    for (const Instr& in : program.per_rank[static_cast<size_t>(rank)])
      if (in.op != InstrOp::Move) cells.push_back(to_string(in));
    for (const SimEvent& e : r.link_events)
      if (e.rank == rank) link.push_back(fmt::format("{}[{:g}-{:g}]", e.name(), e.start, e.end));
    const ShardPeak& peak = program.shard_peak[static_cast<size_t>(rank)];
    fmt::print("  rank {}: {}\n  rank {} link: {}\n  rank {} most units whole: {} weights, {} gradients\n", rank,
               fmt::join(cells, " "), rank, fmt::join(link, " "), rank, peak.weights, peak.gradients);
  }
}

int run(const ScheduleOptions& o) {
  if (o.list) {
    size_t width = 0;
    for (const auto& [name, desc] : list_schedules()) width = std::max(width, name.size());
    for (const auto& [name, desc] : list_schedules()) fmt::print("{:<{}}  {}\n", name, width, desc);
    return 0;
  }
  Costs costs = parse_costs(o.costs, o.comm);
  const auto [s, text] = build(o);
  validate(s);
  const TransferCosts transfer{o.transfer_bytes, o.bandwidth, o.comm};
  if (o.vocab_parallel) {
    if (is_comms_csv(text)) fail("--vocab-parallel: {} is a lowered program; give its compute-only schedule", o.file);
    if (!o.csv.empty() && o.lowered) fail("--vocab-parallel: --csv --lowered cannot write the vocabulary slices yet");
    costs.vocab = parse_vocab_costs(o.vocab_costs);
  }
  // The program the executor would run: the file's own for a compute+comms file.
  ProgramRecipe recipe;
  recipe.tag_ub = kTagUb;
  recipe.vocab_parallel = o.vocab_parallel;
  recipe.vocab_costs = costs;
  recipe.transfer = transfer;
  if (is_comms_csv(text)) {
    recipe.comms_csv = text;
    recipe.file = o.file;
  }
  if (!o.placement.empty()) recipe.placement = o.placement;
  if (!o.shard.empty()) {
    if (o.shard != "gradients" && o.shard != "weights")
      fail("--shard {}: expected gradients or weights (the levels whose collectives are instructions)", o.shard);
    if (o.shard_layers < 1) fail("--shard-layers {}: at least 1", o.shard_layers);
    recipe.shard = {o.shard == "weights", true, o.shard_prefetch, o.shard_reuse == "keep"};
    recipe.units = uniform_units(s, o.shard_layers);
    std::tie(costs.gather, costs.scatter) = parse_shard_costs(o.shard_costs);
  }
  const Program program = build_program(s, recipe);
  // With vocabulary parallelism or shard collectives the schedule is its program.
  const bool as_program = o.vocab_parallel || !o.shard.empty();
  const SimResult r = as_program ? simulate_program(program, costs, transfer) : simulate(s, costs);
  // The lowered program with transfer costs: where its receives are posted shows here.
  const SimResult rp = simulate_program(program, costs, transfer);
  if (o.lowered && o.csv.empty()) fail("--lowered applies to --csv FILE");
  if (!o.csv.empty()) write_file(o.csv, o.lowered ? to_comms_csv(program) : to_csv(s));
  if (!o.svg.empty()) write_file(o.svg, svg_schedule(s, r));
  if (!o.trace.empty()) write_file(o.trace, render_chrome_trace(s, r));
  if (o.json) {
    nlohmann::json j = {
        {"makespan", r.makespan}, {"bubble_fraction", r.bubble_fraction}, {"peak_inflight", r.peak_inflight}};
    if (transfer.time() > 0) j["program_makespan"] = rp.makespan;
    fmt::print("{}\n", j.dump());
    return 0;
  }
  fmt::print(
      "schedule {}: {} ranks, {} stages, {} microbatches (costs F={:g} B={:g} I={:g} "
      "W={:g} comm={:g})\n",
      s.name, s.num_ranks, s.num_stages, s.num_microbatches, costs.F, costs.B, costs.I, costs.W, costs.comm);
  if (o.vocab_parallel) {
    fmt::print(
        "vocabulary parallel: every rank runs its slices EF, OF, OB, EB (costs {:g}, {:g}, {:g}, {:g}) and posts "
        "the collectives in one order; the lowered program:\n",
        costs.vocab[0], costs.vocab[1], costs.vocab[2], costs.vocab[3]);
    for (int rank = 0; rank < program.num_ranks; ++rank) {
      std::vector<std::string> cells;
      for (const Instr& in : program.per_rank[static_cast<size_t>(rank)])
        if (in.op != InstrOp::Move) cells.push_back(to_string(in));
      fmt::print("  rank {}: {}\n", rank, fmt::join(cells, " "));
    }
  }
  if (!o.shard.empty()) print_shard_program(o, program, costs, r);
  fmt::print("{}", render_text(s, r));
  fmt::print("makespan: {:g}\n", r.makespan);
  fmt::print("bubble fraction: {:.4f}\n", r.bubble_fraction);
  fmt::print("peak in-flight per rank: {}\n", fmt::join(r.peak_inflight, " "));
  if (transfer.time() > 0)
    fmt::print(
        "lowered program, {:g} per transfer ({:g} bytes, bandwidth {:g}, latency {:g}): makespan {:g}, "
        "bubble fraction {:.4f}\n",
        transfer.time(), o.transfer_bytes, o.bandwidth, o.comm, rp.makespan, rp.bubble_fraction);
  for (const auto& [path, what] : {std::pair{o.csv, o.lowered ? "lowered program, compute+comms CSV" : "schedule CSV"},
                                   std::pair{o.svg, "SVG"}, std::pair{o.trace, "Chrome trace"}})
    if (!path.empty()) fmt::print("wrote {} ({})\n", path, what);
  return 0;
}

}  // namespace

void add_schedule_command(CLI::App& app, CommandRunner& runner) {
  auto* sub = app.add_subcommand("schedule", "Validate, simulate and draw a pipeline schedule (built-in or CSV file)");
  auto o = std::make_shared<ScheduleOptions>();
  sub->add_option("name", o->name, "Built-in schedule name (see --list)");
  sub->add_option("--file", o->file,
                  "Schedule file: PyTorch compute-only or compute+comms CSV, one row per rank (cells like 0F3, "
                  "0SEND_F3)");
  sub->add_option("--placement", o->placement,
                  "Stage -> rank map for --file: loop (default), v, or a list like 0,1,1,0");
  sub->add_option("--ranks", o->ranks, "Pipeline ranks");
  sub->add_option("--stages", o->stages, "Total (virtual) stages, a multiple of --ranks (default: --ranks)");
  sub->add_option("--microbatches", o->microbatches, "Microbatches per step");
  sub->add_option("--costs", o->costs, "Durations F,I,W of one stage; B = I + W")->capture_default_str();
  sub->add_option("--comm", o->comm, "Latency added to every cross-rank dependency")->capture_default_str();
  sub->add_option("--transfer-bytes", o->transfer_bytes,
                  "Bytes of one activation or gradient transfer (with --bandwidth: the lowered program's "
                  "simulation adds bytes / bandwidth + --comm per transfer)");
  sub->add_option("--bandwidth", o->bandwidth, "Bytes per time unit between two ranks (0: transfers are free)");
  sub->add_flag("--vocab-parallel", o->vocab_parallel,
                "Split the embedding and the output layer over every rank by vocabulary: show the program with "
                "its slices (EF, OF, OB, EB) and collectives, and its simulated timeline");
  sub->add_option("--vocab-costs", o->vocab_costs, "With --vocab-parallel: one rank's slices EF,OF,OB,EB")
      ->capture_default_str();
  sub->add_flag("--json", o->json, "Print only {\"makespan\", \"bubble_fraction\", \"peak_inflight\"} as JSON");
  sub->add_option("--svg", o->svg, "Write an SVG timeline to this file");
  sub->add_option("--trace", o->trace, "Write Chrome-trace JSON (Perfetto) to this file");
  sub->add_option("--csv", o->csv, "Write the schedule as PyTorch compute-only CSV");
  sub->add_flag("--lowered", o->lowered,
                "With --csv: write the lowered program (PyTorch compute_comms CSV: 0F1, 0SEND_F1, 1RECV_F1, ...)");
  sub->add_flag("--list", o->list, "List the registered schedules");
  sub->add_option("--shard", o->shard, "Place sharded data parallelism's collectives: gradients | weights");
  sub->add_option("--shard-layers", o->shard_layers, "With --shard: layers (units) per stage")->capture_default_str();
  sub->add_option("--shard-reuse", o->shard_reuse, "With --shard weights: regather | keep")
      ->check(CLI::IsMember({"regather", "keep"}))
      ->capture_default_str();
  sub->add_option("--shard-prefetch", o->shard_prefetch, "With --shard weights: layers of work a gather runs ahead")
      ->capture_default_str();
  sub->add_option("--shard-costs", o->shard_costs, "With --shard: one unit's GATHER,REDUCE_SCATTER times")
      ->capture_default_str();
  sub->callback([&runner, o] { runner = [o] { return is_world_rank0() ? run(*o) : 0; }; });
}

}  // namespace pipetrain
