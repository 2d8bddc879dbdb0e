// parallel.vocab_parallel resolved for a run: true and false as set; "auto" slices the
// vocabulary where the cost model says the output layer outweighs a stage's fair share of
// the model's work (no split of whole layers can then balance the pipeline) and the run can
// take the slices (grid_rules.hpp's vocab_parallel_problem). The trainer, the run header,
// `pipetrain check` and the planner all ask here; where the slices go in the pipeline's
// timeline is placed by one rule too. Exports: VocabChoice, choose_vocab_parallel,
// vocab_placement_costs.
#pragma once
#include <string>

#include "pipetrain/core/config.hpp"
#include "pipetrain/schedule/simulate.hpp"

namespace pipetrain {

struct VocabChoice {
  bool on = false;
  std::string reason;  // why, for the run header: "parallel.vocab_parallel = true", "auto: ..."
};

// `stages`: the pipeline's stages (pp x virtual_stages); `microbatch_size`: sequences.
VocabChoice choose_vocab_parallel(const Config& cfg, int stages, int microbatch_size);
// The same for a config as written (its own grid and batch).
VocabChoice choose_vocab_parallel(const Config& cfg);

// The costs the slices are placed by (vocab_pieces.hpp), for the trainer and the planner
// alike (the planner then prices the placed program with the cluster's costs): FLOPs in
// units of one block's forward on one rank (a block's products 24 C^2 per token, a slice's
// logits 2 C V / slices), the blocks spread evenly over the `stages`; backwards twice their
// forward.
Costs vocab_placement_costs(const ModelConfig& m, const GridShape& g, int stages);

}  // namespace pipetrain
