// One memory estimate of a placed layout, for every caller: the planner (each candidate,
// plan/layout_cost.cpp), `check` (predict) and the run header (`train`). Each pipeline
// rank's MemoryInputs (cost_model.hpp) from the layout, the stage split and what its
// program keeps; rank_memory turns them into bytes.
// Exports: Holdings, rank_holdings, Placement, memory_inputs, placed_memory.
#pragma once
#include <string>
#include <vector>

#include "pipetrain/core/config.hpp"
#include "pipetrain/model/partition.hpp"
#include "pipetrain/model/stage.hpp"
#include "pipetrain/plan/cost_model.hpp"
#include "pipetrain/plan/planner.hpp"
#include "pipetrain/schedule/program.hpp"
#include "pipetrain/schedule/program_builder.hpp"
#include "pipetrain/schedule/schedule.hpp"

namespace pipetrain {

// What rank r holds of the model: its parameters (as stored, widened for products and in
// dense products' weights), its largest stage stash, and which pieces it has. Under
// vocabulary parallelism the embedding and head pieces keep their positions and final norm;
// every rank holds its slice of the table(s) instead.
struct Holdings {
  double params = 0, widened = 0, dense = 0, largest_stash = 0;
  double weight_pass = 0, largest_weight_pass = 0, working = 0;  // the largest of its stages' (StashBytes)
  double experts = 0;  // of params, the routed experts' (expert-parallel under ep > 1)
  double blocks = 0;   // the blocks on the rank (a half-block counts a half)
  double largest_piece = 0;  // the most parameters one of its layers holds
  bool embedding = false, head = false, block = false;
};

// A moment of a rank's schedule as its stashes see it: the (microbatch, stage) cells live
// (F run, last backward action not), those pending (I run, W not), and the backward at work
// (Op::B, Op::I, or Op::F for none).
struct StashPoint {
  int live = 0, pending = 0;
  Op during = Op::F;
  auto operator<=>(const StashPoint&) const = default;
};
// Per rank: the moments no other moment of the same kind matches or exceeds in both counts
// (the stashes' most is at one of them, whatever the sizes).
std::vector<std::vector<StashPoint>> stash_points(const Schedule& s);

// What a rank's estimate depends on beyond the layout: how the run placed it.
struct Placement {
  const Schedule* schedule = nullptr;
  const std::vector<StageUnits>* units = nullptr;  // the stage split
  std::vector<Recompute> stage_recompute;  // per stage (parallel.recompute_stages); empty: the layout's everywhere
  std::vector<int> peaks;                  // per rank: the schedule's most stashes alive
  const std::vector<std::vector<StashPoint>>* stash_points =
      nullptr;                             // the schedule's (null: placed_memory makes them)
  bool packed = false;                     // runtime.pack_weights resolved: two f32 copies of the matrices
  bool native_bf16 = false;                // the device multiplies bf16 without widened copies
  std::string device_kind = "cpu";         // what attention keeps for its backward, F&B pairs' turns
  int recv_lookahead = kRecvLookahead;     // receive buffers posted ahead (program_builder.hpp)
  Recompute recompute_of(const Layout& l, int stage) const;
};

// `T`: a rank's tokens of each sequence (train.seq_len / cp).
Holdings rank_holdings(const ModelConfig& model, const Layout& l, const Placement& p, int r, int T);
Holdings rank_holdings(const Config& cfg, const Layout& l, const Placement& p, int r);

// Rank r's inputs, less the vocabulary slices' share (vocab_memory.hpp adds it: from the
// placed program, or its bound before one is placed).
MemoryInputs memory_inputs(const Config& cfg, const Layout& l, const Placement& p, const Holdings& h, int r);

// The largest pipeline rank's estimate of a placed run, the slices' share from `program`
// (a vocabulary-parallel layout's placed program; null: its bound), and the units its shard
// collectives hold whole (Program::shard_peak; null or none: no sharded units counted).
RankMemory placed_memory(const Config& cfg, const Layout& l, const Placement& p, const Program* program);

}  // namespace pipetrain
