// BLAS threads per rank without the user knowing BLAS internals.
//
// OpenBLAS starts as many threads as the CPUs its process may run on. Ranks that share
// those CPUs (mpirun or srun without core binding, Open MPI's socket binding above two
// ranks, more ranks than cores) then run ranks x CPUs busy threads on CPUs cores and
// stall each other. Each rank takes its share instead: the CPUs of its affinity mask over
// the ranks that may run on them (topology/node_cpus.hpp), at least 1. A thread count
// the user set (OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS, OMP_NUM_THREADS) is honoured.
//
// Exports: blas_threads_share(), apply_blas_threads(), blas_threads_summary().
#pragma once
#include <string>

namespace pipetrain {

// The threads of a rank whose mask holds `cpus` CPUs that `sharers` ranks may run on.
int blas_threads_share(int cpus, int sharers);

// Sets the BLAS to its share unless the user set a thread count; what was done goes to
// blas_threads_summary(). Call before the first product.
void apply_blas_threads(int cpus, int sharers);

// For the header and --version: "1 thread (2 CPUs shared by 2 ranks)", "8 threads (8
// CPUs of its own)", "4 threads (OPENBLAS_NUM_THREADS)"; before apply_blas_threads, the
// BLAS's current count.
std::string blas_threads_summary();

}  // namespace pipetrain
