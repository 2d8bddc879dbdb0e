// Where this rank runs on its node: how many CPUs its affinity mask allows, and how many
// ranks of the node (itself included) may run on any of those CPUs. Thread pools (the
// BLAS's) are sized from it so that ranks sharing cores do not oversubscribe them.
//
// Exports: NodeCpus, node_cpus().
#pragma once
#include <mpi.h>

namespace pipetrain {

struct NodeCpus {
  int cpus = 1;     // CPUs in this rank's affinity mask
  int sharers = 1;  // ranks on this node whose masks overlap it, itself included
};

// Collective over `comm` (every rank of it calls it).
NodeCpus node_cpus(MPI_Comm comm);

}  // namespace pipetrain
