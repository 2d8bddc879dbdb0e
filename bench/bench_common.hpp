// Shared by the benchmarks: medians and a synthetic token stream.
#pragma once
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <optional>
#include <cstdint>
#include <vector>

#include "pipetrain/core/rng.hpp"
#include "pipetrain/runtime/trainer.hpp"

namespace pipetrain::bench {

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

}  // namespace pipetrain::bench
