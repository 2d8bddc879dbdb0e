// Helpers shared by the subcommands (see pipetrain/app/commands.hpp).
#include <mpi.h>

#include "pipetrain/app/commands.hpp"

namespace pipetrain {

bool is_world_rank0() {
  int init = 0, fin = 0, rank = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank == 0;
}

void run_on_rank0(CLI::App* sub, CommandRunner& runner, std::function<void()> work) {
  sub->callback([&runner, work] {
    runner = [work] {
      if (is_world_rank0()) work();
      return 0;
    };
  });
}

}  // namespace pipetrain
