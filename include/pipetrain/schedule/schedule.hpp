// The schedule IR: what each pipeline rank computes, in order. Pure data: no MPI,
// no tensors. Communication is derived from it (see DESIGN.md, "The schedule IR"):
//   F(m, s) needs F(m, s-1)'s output; B/I(m, s) needs B/I(m, s+1)'s input gradient
//   (for the last stage: its own F(m, s)); W(m, s) follows I(m, s) on the same rank.
// Exports: Op, Action, Schedule, op_char, to_string, loop_placement, v_placement.
// Related headers: registry.hpp (named built-ins), validate.hpp, simulate.hpp,
// csv.hpp (PyTorch compute-only CSV), render.hpp (text grid, SVG, Chrome trace).
#pragma once
#include <string>
#include <vector>

namespace pipetrain {

enum class Op { F, B, I, W };  // forward, full backward, backward-input, backward-weight

struct Action {
  Op op = Op::F;
  int microbatch = 0;
  int stage = 0;  // global (virtual) stage index
  bool operator==(const Action&) const = default;
};

struct Schedule {
  std::string name;
  int num_stages = 0, num_ranks = 0, num_microbatches = 0;
  std::vector<int> stage_to_rank;              // loop placement, V placement, or any map
  std::vector<std::vector<Action>> per_rank;   // each rank's program, in execution order
  // Overlapped pairs (DualPipeV's "&"): per rank, the indices i whose F runs overlapped with
  // action i + 1: a B or I of another stage (an F&B pair), or an F that does not take its
  // output (an F&F pair). Empty: none. Lowering keeps the two adjacent.
  std::vector<std::vector<int>> pairs;
};

char op_char(Op op);
// "2F0" style cell of PyTorch's compute-only CSV: <stage><op><microbatch>.
std::string to_string(const Action& a);

// Stage -> rank maps. loop: stage s on rank s % R. v: ranks 0..R-1 take stages
// 0..R-1, then R-1..0 take stages R..2R-1 (and so on, alternating direction).
std::vector<int> loop_placement(int num_stages, int num_ranks);
std::vector<int> v_placement(int num_stages, int num_ranks);

}  // namespace pipetrain
