// parallel.vocab_parallel resolved for a run: true and false as set; "auto" slices the
// vocabulary where the cost model says the output layer outweighs a stage's fair share of
// the model's work (no split of whole layers can then balance the pipeline) and the run can
// take the slices (grid_rules.hpp's vocab_parallel_problem). The trainer, the run header,
// `pipetrain check` and the planner all ask here. Exports: VocabChoice, choose_vocab_parallel.
#pragma once
#include <string>

#include "pipetrain/core/config.hpp"

namespace pipetrain {

struct VocabChoice {
  bool on = false;
  std::string reason;  // why, for the run header: "parallel.vocab_parallel = true", "auto: ..."
};

// `stages`: the pipeline's stages (pp x virtual_stages); `microbatch_size`: sequences.
VocabChoice choose_vocab_parallel(const Config& cfg, int stages, int microbatch_size);
// The same for a config as written (its own grid and batch).
VocabChoice choose_vocab_parallel(const Config& cfg);

}  // namespace pipetrain
