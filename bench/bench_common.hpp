// Shared by the benchmarks: medians, a synthetic token stream, page-fault counts.
#pragma once
#include <mpi.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <optional>
#include <cstdint>
#include <vector>

#include "pipetrain/core/rng.hpp"
#include "pipetrain/runtime/trainer.hpp"

namespace pipetrain::bench {

// This process's minor page faults so far (a step's are the difference around it).
inline double minor_faults() {
  rusage r{};
  getrusage(RUSAGE_SELF, &r);
  return static_cast<double>(r.ru_minflt);
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Parses the command line; on --help or a bad option, ends MPI and returns the exit code.
inline std::optional<int> parse_args(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    MPI_Finalize();
    return app.exit(e);
  }
  return std::nullopt;
}

// --pack-weights[=auto|true|false] (runtime.pack_weights): bare, it means true; absent, auto.
inline void add_pack_weights(CLI::App& app, std::string& value, const std::string& where) {
  value = "auto";
  app.add_flag("--pack-weights{true}", value, "runtime.pack_weights (auto, true or false), " + where)
      ->check(CLI::IsMember({"auto", "true", "false"}));
}
inline Toggle pack_toggle(const std::string& value) {
  return value == "true" ? Toggle::On : value == "false" ? Toggle::Off : Toggle::Auto;
}

// Uniformly random inputs and targets (throughput does not depend on the text).
inline BatchSource random_tokens(int vocab, int T) {
  return [vocab, T](int64_t first, int count, int32_t* in, int32_t* tgt) {
    Rng rng = Rng::for_stream(static_cast<uint64_t>(first), "bench");
    for (int i = 0; i < count * T; ++i) {
      in[i] = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(vocab));
      tgt[i] = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(vocab));
    }
  };
}

// The mean of x over the ranks of MPI_COMM_WORLD (each rank's single-rank step of a round).
inline double mean_over_ranks(double x) {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return x / size;
}

// The single-rank baselines run on every rank (core) at once; a VM's cores can differ in
// speed, and a synchronous layout over them is paced by the slowest. Gathers each rank's
// single-rank step and returns their mean; rank 0 prints them with that bound: at most
// size x mean / slowest of linear.
inline double single_rank_mean(double step_s, int rank) {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<double> all(static_cast<size_t>(size));
  MPI_Allgather(&step_s, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD);
  double sum = 0;
  for (double s : all) sum += s;
  const double mean = sum / size, slowest = *std::max_element(all.begin(), all.end());
  if (rank == 0)
    fmt::print("  single-rank step per rank (median): {:.3f} s: the cores differ by {:.0f}%; a layout over all of "
               "them reaches at most {:.2f} x single rank\n",
               fmt::join(all, " s, "), 100.0 * (slowest / *std::min_element(all.begin(), all.end()) - 1.0),
               size * mean / slowest);
  return mean;
}

// Prints each rank's median step phases (StepMetrics::Phases, collected per step),
// gathered on rank 0 of MPI_COMM_WORLD.
inline void print_phases(const std::vector<double> (&phase)[4], int rank) {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  double mine[4];
  for (int k = 0; k < 4; ++k) mine[k] = median(phase[k]);
  std::vector<double> all(static_cast<size_t>(4 * size));
  MPI_Gather(mine, 4, MPI_DOUBLE, all.data(), 4, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  if (rank != 0) return;
  for (int r = 0; r < size; ++r) {
    const double* p = &all[static_cast<size_t>(4 * r)];
    fmt::print("  rank {}: program {:.3f} s, gradient reductions after it {:.3f} s, loss and norm {:.3f} s, "
               "optimizer {:.3f} s\n",
               r, p[0], p[1], p[2], p[3]);
  }
}

}  // namespace pipetrain::bench
