// Vocabulary parallelism in the lowered program: every pipeline rank holds a slice of the
// input embedding and of the output layer, and the program says when each rank runs its
// slice of each microbatch and posts the collectives that join the slices (program.hpp:
// VOCAB and COLL; the paper: Yeung et al., "Balancing Pipeline Parallelism with
// Vocabulary Parallelism", MLSys 2025).
//
// Two passes, each testable alone:
//  - delay_backwards: every rank runs one more forward before each backward, so the last
//    stage's backward of microbatch m is one slot behind its forward: the slot in which
//    every rank computes its share of m's output layer (one more stash per rank, the p+1
//    the paper reports).
//  - place_vocab_pieces: from the program's simulated timeline, the pieces that post a
//    collective (EF, OF, BCAST_DE's post) go into each rank's list in one order on every
//    rank (MPI's rule for collectives), each at the first boundary after its input can
//    exist (the last stage's F for OF, the first stage's backward for BCAST_DE; EF two
//    microbatches ahead of the first stage) or where the rank would otherwise wait, and
//    before the first action that depends on it; OB (the weight gradient, needed by nothing
//    but the step's end) and EB go where each rank would otherwise wait. The collectives are
//    nonblocking: a rank waits only where it consumes one.
// validate_program proves the result (validate_vocab.cpp) like the point-to-point traffic.
// Exports: delay_backwards, place_vocab_pieces, lower_vocab_parallel.
#pragma once
#include "pipetrain/schedule/program.hpp"
#include "pipetrain/schedule/simulate.hpp"

namespace pipetrain {

// The schedule with each backward action (B, I, W) on a rank moved after the `forwards`
// forwards that follow it (as many as there are). Unchanged where no forward follows
// (GPipe).
Schedule delay_backwards(const Schedule& s, int forwards = 1);

// Adds the vocabulary slices and their collectives to a lowered program, placed by its
// simulated timeline under `costs` (costs.vocab: one rank's slices) and `transfer` (each
// transfer's and each collective's time): under several policies (how eagerly pieces go
// first, how many OBs may wait), the shortest simulated step. Throws pipetrain::Error when
// no policy can place a slice between its input and its first dependant on some rank.
Program place_vocab_pieces(Program p, const Costs& costs, const TransferCosts& transfer = {});

// lower and place_vocab_pieces, for the schedule as given and with its backwards delayed
// by 1 and 2 forwards: the shortest simulated step (the fewest stashes on a tie).
Program lower_vocab_parallel(const Schedule& s, const LowerOptions& options, const Costs& costs,
                             const TransferCosts& transfer = {});

}  // namespace pipetrain
