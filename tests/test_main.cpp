// GoogleTest entry point: MPI (as a singleton) and Kokkos are up before any test runs.
#include <cstdio>
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
  // One CTest entry runs a file's suites: report it skipped (77) when every test it ran
  // was skipped, and failed when the filter matched no test at all.
  const auto& unit = *::testing::UnitTest::GetInstance();
  if (rc == 0 && unit.test_to_run_count() == 0) {
    std::fprintf(stderr, "no test matched the filter\n");
    rc = 1;
  } else if (rc == 0 && unit.successful_test_count() == 0 && unit.skipped_test_count() > 0) {
    rc = 77;
  }
  MPI_Finalize();
  return rc;
}
