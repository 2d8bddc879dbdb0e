// How much memory one rank of this node may count on: the node's memory the job may use
// (physical memory, or less where a cgroup limits the job, as Slurm's --mem does), shared
// evenly by the job's ranks on the node. What runtime.pack_weights = "auto" weighs its
// copies against.
//
// Exports: node_memory_per_rank().
#pragma once
#include <mpi.h>

namespace pipetrain {

// Bytes; collective over `comm` (every rank of it calls it).
double node_memory_per_rank(MPI_Comm comm);

}  // namespace pipetrain
