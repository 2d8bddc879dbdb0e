#include "pipetrain/schedule/tag_plan.hpp"

#include <map>
#include <utility>

#include "pipetrain/core/error.hpp"

namespace pipetrain {

TagPlan::TagPlan(const std::vector<int>& stage_to_rank, int num_microbatches, bool with_gradients, int tag_ub)
    : microbatches_(num_microbatches) {
  const int S = static_cast<int>(stage_to_rank.size());
  if (num_microbatches < 1) fail("tag plan: {} microbatches (need at least 1)", num_microbatches);
  auto rank = [&](int s) { return stage_to_rank[static_cast<size_t>(s)]; };
  std::map<std::pair<int, int>, int> per_pair;  // (source, destination) -> transfers per microbatch
  for (int kind = 0; kind < 2; ++kind) {
    slots_[kind].assign(static_cast<size_t>(S), Slot{});
    if (kind == 1 && !with_gradients) continue;
    for (int s = 0; s < S; ++s) {
      const int producer = kind == 0 ? s - 1 : s + 1;
      if (producer < 0 || producer >= S || rank(producer) == rank(s)) continue;
      slots_[kind][static_cast<size_t>(s)].index = per_pair[{rank(producer), rank(s)}]++;
    }
  }
  std::pair<int, int> busiest{0, 0};
  int widest = 0;
  for (const auto& [pair, n] : per_pair) {
    count_ += static_cast<long>(n) * num_microbatches;
    if (n > widest) widest = n, busiest = pair;
  }
  for (int kind = 0; kind < 2; ++kind)
    for (int s = 0; s < S; ++s) {
      Slot& slot = slots_[kind][static_cast<size_t>(s)];
      if (slot.index < 0) continue;
      const int producer = kind == 0 ? s - 1 : s + 1;
      slot.width = per_pair[{rank(producer), rank(s)}];
    }
  const long largest = static_cast<long>(num_microbatches) * widest - 1;
  if (largest > tag_ub)
    fail("the pipeline's message tags need values up to {} ({} microbatches x {} transfers per microbatch from "
         "pipeline rank {} to {}), above this MPI's MPI_TAG_UB = {}; run fewer microbatches per step (larger "
         "microbatches) or fewer virtual stages",
         largest, num_microbatches, widest, busiest.first, busiest.second, tag_ub);
  max_tag_ = static_cast<int>(largest);
}

int TagPlan::tag(Transfer kind, int microbatch, int consumer_stage) const {
  const auto& slots = slots_[static_cast<int>(kind)];
  if (consumer_stage < 0 || static_cast<size_t>(consumer_stage) >= slots.size() ||
      slots[static_cast<size_t>(consumer_stage)].index < 0 || microbatch < 0 || microbatch >= microbatches_)
    fail("tag plan: no {} transfer feeds stage {} of microbatch {} (the plan covers {} microbatches)",
         kind == Transfer::Activation ? "activation" : "gradient", consumer_stage, microbatch, microbatches_);
  const Slot& slot = slots[static_cast<size_t>(consumer_stage)];
  return microbatch * slot.width + slot.index;
}

}  // namespace pipetrain
