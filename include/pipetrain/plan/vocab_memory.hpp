// Vocabulary parallelism's share of a rank's memory (MemoryInputs' vocab fields and its
// stash peak), for the run header's estimate and the planner's: from the placed program
// where there is one, else a bound for pruning layouts before any is placed.
// Exports: add_vocab_memory, add_vocab_memory_bound.
#pragma once
#include "pipetrain/core/config.hpp"
#include "pipetrain/core/dtype.hpp"
#include "pipetrain/plan/cost_model.hpp"
#include "pipetrain/schedule/program.hpp"

namespace pipetrain {

// From rank `rank`'s placed program: its own stash peak (`peak_inflight`, simulate_program's
// for the rank: backwards may be delayed), the output slices alive between OF and OB plus OF's working copy of its logits, and the
// collectives' buffers in flight — a partial lookup being summed, the hidden states and the
// embedding's gradient being received (N x C each), and the softmax partials of the
// hidden-state gradient (2 N x C each) on the last stage's rank from OF until its backward.
void add_vocab_memory(const Program& prog, int rank, int peak_inflight, const ModelConfig& model, int slices, int B,
                      int T, DType storage, MemoryInputs& in);
// The same bounded without the program: the lowering delays backwards by at most two
// forwards (the paper's p + 2 stashes), keeps at most four OBs pending (five slices alive,
// at most the microbatches) and, on the last stage, at most three partials.
void add_vocab_memory_bound(bool last_stage, int microbatches, const ModelConfig& model, int slices, int B, int T,
                            DType storage, MemoryInputs& in);

}  // namespace pipetrain
