// Lowered programs in PyTorch's compute_comms CSV (torch.distributed.pipelining): one row
// per rank, cells in execution order — compute cells as in the compute-only format
// ("0F1", "1B0") and transfer cells "0SEND_F1" (stage 0 sends the activation of
// microbatch 1), "1RECV_F1" (stage 1 posts its receive), "1SEND_B0", "0RECV_B0". Hand-offs
// between stages of the same rank (MOVE) are not written: they follow from the placement.
// An overlapped pair's F cell ends in "&" (csv.hpp).
// Exports: is_comms_csv, to_comms_csv, program_from_csv, compute_only.
#pragma once
#include <string>

#include "pipetrain/schedule/program.hpp"

namespace pipetrain {

// Whether the CSV text holds any transfer cell (then it is a compute+comms file).
bool is_comms_csv(const std::string& text);

// One line per rank: every instruction but MOVE, in order (idle ranks: one empty cell).
std::string to_comms_csv(const Program& p);

// Reads a compute+comms file: the compute cells give the schedule (placement as for
// from_csv), the transfer cells stay where the file puts them — a file runs exactly in
// the order given; peers, tags and MOVEs come from the placement. Not validated here:
// call validate_program, which names the rank, position and instruction of a transfer
// that is unmatched or out of order (positions count the row's non-empty cells).
Program program_from_csv(const std::string& text, const std::string& origin, const std::string& placement,
                         int tag_ub);

// The compute actions of a program, per rank, in order.
Schedule compute_only(const Program& p);

}  // namespace pipetrain
