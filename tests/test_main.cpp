// GoogleTest entry point: MPI (as a singleton) and Kokkos are up before any test runs.
#include <gtest/gtest.h>
#include <mpi.h>

#include "pipetrain/core/runtime_env.hpp"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rc = 0;
  {
    pipetrain::KokkosSession kokkos(argc, argv);
    rc = RUN_ALL_TESTS();
  }
  MPI_Finalize();
  return rc;
}
