#include "pipetrain/app/fail_fast.hpp"

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>
#include <string>
#include <thread>

namespace pipetrain {

namespace {

void world(int& rank, int& size) {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  rank = 0;
  size = 1;
  if (init && !fin) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
}

[[noreturn]] void on_terminate() { end_job(describe_current_exception().c_str()); }

}  // namespace

std::string describe_current_exception() {
  std::exception_ptr e = std::current_exception();
  if (!e) return "std::terminate was called without an active exception";
  try {
    std::rethrow_exception(e);
  } catch (const std::bad_alloc& x) {
    return std::string("out of memory (") + x.what() + ")";
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an exception of unknown type";
  }
}

void install_fail_fast() { std::set_terminate(on_terminate); }

void end_job(const char* what) {
  int rank = 0, size = 1;
  world(rank, size);
  if (size > 1)
    std::fprintf(stderr, "pipetrain: error (rank %d): %s\n", rank, what);
  else
    std::fprintf(stderr, "pipetrain: error: %s\n", what);
  std::fflush(stderr);
  if (size > 1) {
    // A moment for the launcher to forward this line (and for peers that hit the same
    // error to print theirs) before the abort tears the job down.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Finalize();
  std::exit(1);
}

}  // namespace pipetrain
