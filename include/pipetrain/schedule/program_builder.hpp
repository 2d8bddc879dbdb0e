// The one place a schedule becomes the program its ranks run: the lowering passes composed
// once, in one order, and proven. The trainer (training and evaluation), `check`, the
// planner and `pipetrain schedule` all build their programs here, so what the simulator,
// the validator and the cost model read is what the executor runs.
//
//   1. the source: a compute+comms file's program as written | the vocabulary slices'
//      lowering (vocab_pieces.hpp, the slices placed by the recipe's costs) | the plain
//      lowering (program.hpp), receives posted kRecvLookahead compute actions ahead;
//   2. validate_program: transfers matched, tags, stashes, no deadlock;
//   3. in-order transports (NCCL's): lowered with receives one action ahead, then moved
//      into one order on every pair (post_for_in_order) and validated again; a file's
//      program must already run in order (validate_in_order);
//   4. sharded data parallelism (shard_pass.hpp): the shard collectives placed and proven
//      (validate_shards), the working set they leave in Program::shard_peak.
//
// Exports: kRecvLookahead, ProgramRecipe, build_program.
#pragma once
#include <climits>
#include <string>

#include "pipetrain/schedule/program.hpp"
#include "pipetrain/schedule/shard_pass.hpp"
#include "pipetrain/schedule/simulate.hpp"

namespace pipetrain {

// Compute actions ahead whose inputs are posted as receives (the stage buffers the memory
// estimate counts: cost_model.hpp's MemoryInputs::receive_buffers).
inline constexpr int kRecvLookahead = 4;

struct ProgramRecipe {
  int tag_ub = INT_MAX;   // MPI_TAG_UB of the pipeline's communicator
  bool in_order = false;  // the pipeline's transfers match in issue order (NCCL)
  // Vocabulary parallelism: the output layer's and embedding's slices and their
  // collectives, placed in the timeline `vocab_costs` (and `transfer`) give.
  bool vocab_parallel = false;
  Costs vocab_costs;
  TransferCosts transfer;
  // A compute+comms CSV (program_csv.hpp): its text, name and stage placement. Its program
  // runs exactly as written.
  std::string comms_csv, file, placement = "loop";
  // parallel.shard: the collectives to place and the units they move (shard_pass.hpp).
  ShardPlacement shard;
  ShardUnits units;
};

// The receives a program of this recipe posts ahead (1 under in-order transports).
int recv_lookahead(const ProgramRecipe& r);

// Throws pipetrain::Error naming what fails: a pass that cannot take the recipe (a
// compute+comms file with vocabulary slices, the slices' collectives on in-order
// transports) or a proof.
Program build_program(const Schedule& s, const ProgramRecipe& r);

}  // namespace pipetrain
