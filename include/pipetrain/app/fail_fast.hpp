// Ending the whole job on an error, from any rank, without hanging.
//
// In a job of several ranks an error must end the job where it is raised. Unwinding is
// what hangs: a destructor on the way up may wait for a message (a posted receive), close
// a parallel HDF5 file (collective) or free a communicator while the peers wait
// elsewhere. So the command catches nothing in a multi-rank job: an escaping exception
// finds no handler, the C++ runtime calls std::terminate with the stack intact (no
// destructor runs), and the handler installed here prints the message once with the
// rank, then calls MPI_Abort, which ends every rank. A single-rank run unwinds normally.
#pragma once
#include <string>

namespace pipetrain {

// Installs the terminate handler. Call once, after MPI_Init.
void install_fail_fast();

// Prints "pipetrain: error (rank R): what" (no rank in a single-rank run) and ends the
// job: MPI_Abort when there are peers, exit(1) otherwise.
[[noreturn]] void end_job(const char* what);

// The message of the exception being handled ("out of memory (std::bad_alloc)" for a
// failed allocation).
std::string describe_current_exception();

}  // namespace pipetrain
