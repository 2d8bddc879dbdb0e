// An MPI implementation's integer control variables, through the MPI tool interface
// (MPI_T): read one by name, or choose its value when it still has its default — how
// MpiCommunicator picks Open MPI's collective algorithms without overriding a user's.
// Both are no-ops (-1 / false) on an MPI without a variable of that name and type.
// Exports: mpi_tool_int, choose_mpi_tool_int.
#pragma once

namespace pipetrain {

// The variable's value, or -1 when this MPI has no integer variable of that name.
int mpi_tool_int(const char* name);
// Sets the variable to `value` when it reads `unset` (its default); true when written.
bool choose_mpi_tool_int(const char* name, int value, int unset = 0);

}  // namespace pipetrain
