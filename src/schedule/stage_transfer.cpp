// How tensors cross a stage boundary under tensor parallelism (schedule/stage_transfer.hpp).
#include "pipetrain/schedule/stage_transfer.hpp"

namespace pipetrain {

StageTransfer stage_transfer(int tp, bool sequence_parallel) {
  if (tp <= 1) return StageTransfer::Whole;
  return sequence_parallel ? StageTransfer::Rows : StageTransfer::SliceThenGather;
}

}  // namespace pipetrain
