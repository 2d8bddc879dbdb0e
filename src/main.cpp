// The `pipetrain` command: parses the command line, runs one subcommand, and
// turns any pipetrain::Error into one printed line and a job-wide non-zero exit.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <thread>
#include <exception>

#include "pipetrain/app/commands.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/core/runtime_env.hpp"

namespace {

int world_rank() {
  int init = 0, rank = 0;
  MPI_Initialized(&init);
  if (init) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int world_size() {
  int init = 0, size = 1;
  MPI_Initialized(&init);
  if (init) MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// Every rank that hits an error prints it (prefixed with its rank when there is more
// than one), then the whole job ends: MPI_Abort makes sure no peer is left waiting.
[[noreturn]] void die(const char* what) {
  if (world_size() > 1)
    std::fprintf(stderr, "pipetrain: error (rank %d): %s\n", world_rank(), what);
  else
    std::fprintf(stderr, "pipetrain: error: %s\n", what);
  std::fflush(stderr);
  if (world_size() > 1) {
    // A short grace period lets peers that hit the same error report it themselves
    // before the abort tears the job down.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int fin = 0;
  MPI_Finalized(&fin);
  int init = 0;
  MPI_Initialized(&init);
  if (init && !fin) MPI_Finalize();
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int status = 0;
  try {
    pipetrain::KokkosSession kokkos(argc, argv);
    CLI::App app{"pipetrain: pipeline-parallel transformer training"};
    app.require_subcommand(1);
    app.set_version_flag("--version", pipetrain::version_text());
    pipetrain::CommandRunner runner;
    pipetrain::add_train_command(app, runner);
    pipetrain::add_data_command(app, runner);
    pipetrain::add_schedule_command(app, runner);
    pipetrain::add_ckpt_command(app, runner);
    pipetrain::add_report_command(app, runner);
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      status = app.exit(e);
      MPI_Finalize();
      return status;
    }
    status = runner ? runner() : 0;
  } catch (const pipetrain::Error& e) {
    die(e.what());
  } catch (const std::exception& e) {
    die(e.what());
  }
  MPI_Finalize();
  return status;
}
