// Chrome-trace JSON (opens in Perfetto / chrome://tracing) of the real execution:
// every rank's compute and wait events gathered to rank 0 of `comm` into one file.
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

#include "pipetrain/runtime/executor.hpp"

namespace pipetrain {

// Collective over `comm`. Event times are seconds; rank 0 writes `path`.
void write_chrome_trace(const std::string& path, const std::vector<TraceEvent>& local, MPI_Comm comm);

}  // namespace pipetrain
