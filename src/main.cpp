// The `pipetrain` command: parses the command line and runs one subcommand. Errors end
// the whole job with one printed line and a non-zero exit (pipetrain/app/fail_fast.hpp).
#include <mpi.h>

#include <CLI/CLI.hpp>

#include "pipetrain/app/commands.hpp"
#include "pipetrain/app/fail_fast.hpp"
#include "pipetrain/backend/blas_kernel.hpp"
#include "pipetrain/backend/blas_threads.hpp"
#include "pipetrain/core/fault.hpp"
#include "pipetrain/core/runtime_env.hpp"
#include "pipetrain/core/malloc_policy.hpp"
#include "pipetrain/topology/node_cpus.hpp"

namespace {

int world_size() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

int run(int argc, char** argv) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  pipetrain::fault::arm_from_environment(rank);
  pipetrain::KokkosSession kokkos(argc, argv);
  CLI::App app{"pipetrain: pipeline-parallel transformer training"};
  app.require_subcommand(1);
  app.set_version_flag("--version", pipetrain::version_text());
  pipetrain::CommandRunner runner;
  pipetrain::add_train_command(app, runner);
  pipetrain::add_check_command(app, runner);
  pipetrain::add_data_command(app, runner);
  pipetrain::add_schedule_command(app, runner);
  pipetrain::add_ckpt_command(app, runner);
  pipetrain::add_report_command(app, runner);
  pipetrain::add_generate_command(app, runner);
  pipetrain::add_plan_command(app, runner);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return runner ? runner() : 0;
}

}  // namespace

int main(int argc, char** argv) {
  pipetrain::select_blas_kernel(argv);  // may re-execute with a better OpenBLAS kernel; before MPI starts
  pipetrain::keep_freed_host_memory();  // MPI's per-call scratch buffers reused, not faulted in afresh each step
  int provided = 0;
  // MULTIPLE: the dp reducer's progress thread (comm/progress_thread) calls MPI while the
  // main thread computes; with less, that thread is simply not started.
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  pipetrain::install_fail_fast();
  const pipetrain::NodeCpus where = pipetrain::node_cpus(MPI_COMM_WORLD);  // before the first product
  pipetrain::apply_blas_threads(where.cpus, where.sharers);
  int status = 0;
  if (world_size() > 1) {
    status = run(argc, argv);  // nothing caught: an error ends the job where it is raised
  } else {
    try {
      status = run(argc, argv);
    } catch (...) {
      pipetrain::end_job(pipetrain::describe_current_exception().c_str());
    }
  }
  MPI_Finalize();
  return status;
}
