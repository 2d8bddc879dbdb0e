// How an activation or its gradient crosses a stage boundary under tensor parallelism: the
// executor's rule (runtime/executor_impl.hpp), which the cost model prices and the memory
// estimate sizes, decided once. Each tp rank of the sending stage holds the whole tensor and
// sends its 1/tp slice, which the receiving stage all-gathers (the same bytes on the link as
// one rank sending it all, tp times the link); under sequence parallelism each rank holds
// and sends its 1/tp of the rows, which the next stage takes as they are.
#pragma once

namespace pipetrain {

enum class StageTransfer { Whole, SliceThenGather, Rows };

StageTransfer stage_transfer(int tp, bool sequence_parallel);

}  // namespace pipetrain
