// The lines `pipetrain train` prints before step 0 that `pipetrain check` prints too, so
// that a checked config shows the header its run will show.
// Exports: human, model_line, shard_line, grid_line, plan_line.
#pragma once
#include <cstdint>
#include <string>

#include "pipetrain/core/config.hpp"
#include "pipetrain/plan/cluster.hpp"
#include "pipetrain/plan/planner.hpp"
#include "pipetrain/schedule/program.hpp"

namespace pipetrain {

// 124.44M, 1.50G: three significant decimals and an SI prefix.
std::string human(double x);

// "pipetrain train CONFIG: GPT-2 12 layers, 12 heads, d_model 768, 124.44M parameters"
std::string model_line(const Config& cfg, int64_t params);

// "  grid dp 1 x pp 2 x cp 1 x tp 1, ep 1 (2 ranks); schedule 1f1b: 2 stages, 8 microbatches,
// simulated bubble 11.1% (F=1, B=2); memory estimate 512 MiB per rank (largest)"
struct GridSummary {
  GridShape grid;
  std::string schedule;
  int stages = 1, microbatches = 1;
  double bubble = 0;        // simulated, F=1, B=2
  double memory_bytes = 0;  // the largest rank's estimate
  int vocab_slices = 0;     // parallel.vocab_parallel: the slices (pp x tp); 0 = off
  int padded_vocab = 0;
  std::string vocab_reason;  // why on or off (plan/vocab_choice.hpp); "" = off as set
  bool sequence_parallel = false;  // parallel.sequence_parallel in effect (tp > 1)
};
// parallel.shard = "gradients" | "weights": what each rank keeps, and the most the program's
// shard collectives hold whole on one rank (Program::shard_peak); empty below those levels.
std::string shard_line(const Config& cfg, const Program& program);
std::string grid_line(const GridSummary& g);

// "  plan: LAYOUT; predicted step ... (cluster SOURCE)"; `note` follows "plan" (the
// --plan auto summary, or empty).
std::string plan_line(const std::string& note, const Layout& layout, const Prediction& p, const ClusterSpec& cluster);

}  // namespace pipetrain
