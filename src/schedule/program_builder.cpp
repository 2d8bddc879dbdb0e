#include "pipetrain/schedule/program_builder.hpp"

#include "pipetrain/core/error.hpp"
#include "pipetrain/schedule/program_csv.hpp"
#include "pipetrain/schedule/vocab_pieces.hpp"

namespace pipetrain {

int recv_lookahead(const ProgramRecipe& r) { return r.in_order ? 1 : kRecvLookahead; }

namespace {
// Step 1: the program before the passes that depend on the transport.
Program source_program(const Schedule& s, const ProgramRecipe& r) {
  const LowerOptions options{recv_lookahead(r), r.tag_ub};
  if (r.vocab_parallel) {
    if (!r.comms_csv.empty()) fail("{}: a compute+comms file has no vocabulary slices", r.file);
    if (r.in_order)
      fail("parallel.vocab_parallel = true: comm.p2p = \"nccl\" (in-order transfers) cannot run its collectives yet");
    return lower_vocab_parallel(s, options, r.vocab_costs, r.transfer);
  }
  if (!r.comms_csv.empty()) return program_from_csv(r.comms_csv, r.file, r.placement, r.tag_ub);
  return lower(s, options);
}
}  // namespace

namespace {
// Steps 1 to 3.
Program transfers_program(const Schedule& s, const ProgramRecipe& r) {
  Program p = source_program(s, r);
  validate_program(p, r.tag_ub);  // step 2
  if (!r.in_order) return p;
  if (!r.comms_csv.empty()) {  // step 3: a file runs as written, so it must already run in order
    validate_in_order(p);
    return p;
  }
  p = post_for_in_order(std::move(p));
  validate_program(p, r.tag_ub);
  return p;
}
}  // namespace

Program build_program(const Schedule& s, const ProgramRecipe& r) {
  Program p = transfers_program(s, r);
  if (!r.shard.any()) return p;
  p = place_shard_collectives(std::move(p), r.units, r.shard);  // step 4
  p.shard_peak = validate_shards(p, r.units, r.shard);
  return p;
}

}  // namespace pipetrain
