// The index of a compute-only schedule's actions and the checks validate() makes on the
// schedule itself, before lowering it (internal to the schedule library).
// Exports: Slot, ActionTable, Dependency, dependencies, check_rank_order.
#pragma once
#include <vector>

#include "pipetrain/schedule/schedule.hpp"

namespace pipetrain {

// Where an action sits: rank and position in that rank's program (-1: absent).
struct Slot {
  int rank = -1, pos = -1;
  bool present() const { return rank >= 0; }
};

// Index of every action of a schedule. Construction performs the structural checks of
// validate() (sizes, ranges, owner rank, duplicates, completeness) and throws on failure.
class ActionTable {
 public:
  explicit ActionTable(const Schedule& s);
  const Slot& at(Op op, int microbatch, int stage) const;
  // The action that produces the input gradient of stage `stage`: B, or I when split.
  Action backward_of(int microbatch, int stage) const;

 private:
  int num_stages_ = 0, num_microbatches_ = 0;
  std::vector<Slot> slots_;  // [op][stage][microbatch]
};

// One input of an action: its producer and what it hands over ("activation",
// "gradient", "stashed activation", "input-gradient split").
struct Dependency {
  Action producer;
  const char* what = "";
};

// The (at most two) inputs of `a`: F(m,s) <- F(m,s-1); B/I(m,s) <- F(m,s) and the
// backward of (m,s+1); W(m,s) <- I(m,s).
std::vector<Dependency> dependencies(const Schedule& s, const ActionTable& t, const Action& a);

// Throws if some rank runs an action before a same-rank action it depends on.
void check_rank_order(const Schedule& s, const ActionTable& t);

}  // namespace pipetrain
