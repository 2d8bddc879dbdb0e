// TagPlan: the MPI tag of every cross-rank transfer of one step, fixed before step 0.
//
// A transfer feeds consumer stage s of microbatch m: the activation F(m, s-1) -> F(m, s)
// or the gradient B(m, s+1) -> B(m, s). Only the (source, tag) pair must be unique at a
// receiver, so tags are numbered densely per ordered pair of ranks: a pair that carries
// n transfers per microbatch uses tags m * n + j, j < n. The largest tag is therefore
// microbatches x (transfers per microbatch between the busiest pair) - 1 — for loop
// placement that is microbatches x virtual stages - 1 (1024 x 8 fits in 32767, the
// smallest MPI_TAG_UB the standard allows) — and a plan that exceeds the MPI's bound is
// refused before any compute. Pure: no MPI here; the caller passes MPI_TAG_UB.
#pragma once
#include <vector>

namespace pipetrain {

enum class Transfer { Activation = 0, Gradient = 1 };

class TagPlan {
 public:
  TagPlan() = default;
  // Transfers of `num_microbatches` microbatches through the stage -> rank map; with
  // with_gradients = false only activations (forward-only evaluation). Throws
  // pipetrain::Error naming the bound when the largest tag would exceed tag_ub.
  TagPlan(const std::vector<int>& stage_to_rank, int num_microbatches, bool with_gradients, int tag_ub);

  // The tag of the transfer feeding `consumer_stage` of `microbatch`. Throws
  // pipetrain::Error when the plan has no such transfer (same rank, out of range).
  int tag(Transfer kind, int microbatch, int consumer_stage) const;
  int max_tag() const { return max_tag_; }
  // Cross-rank transfers in one step.
  long count() const { return count_; }
  int num_microbatches() const { return microbatches_; }

 private:
  struct Slot {
    int index = -1;  // j: position among the pair's transfers (-1: no transfer)
    int width = 0;   // n: transfers per microbatch between the pair
  };
  std::vector<Slot> slots_[2];  // [kind][consumer stage]
  int microbatches_ = 0;
  int max_tag_ = -1;
  long count_ = 0;
};

}  // namespace pipetrain
