// GoogleTest entry point: Kokkos must be up before any kernel runs.
#include <gtest/gtest.h>

#include "pipetrain/core/runtime_env.hpp"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  pipetrain::KokkosSession kokkos(argc, argv);
  return RUN_ALL_TESTS();
}
