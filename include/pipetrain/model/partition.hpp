// How GPT-2's units (embedding, blocks, head) are split over pipeline stages:
// the embedding goes with stage 0, the loss head with the last stage, and the
// blocks are spread evenly (earlier stages take the remainder) or as given by
// parallel.layers_per_stage.
#pragma once
#include <vector>

#include "pipetrain/core/config.hpp"

namespace pipetrain {

struct StageUnits {
  int first = 0, last = 0;  // units [first, last): 0 = embedding, 1..L = blocks, L+1 = head
};

std::vector<StageUnits> partition_gpt2(const ModelConfig& model, int num_stages,
                                       const std::vector<int>& layers_per_stage = {});

}  // namespace pipetrain
