// Activation recomputation on grids: selective and full give the single layout's own
// losses and parameters bit for bit — every built-in schedule on pp = 2 (recomputation at
// I for the split-backward ones, V and interleaved placements included), and tp 2 x dp 2.
#include <gtest/gtest.h>

#include "mpi/mpi_fixtures.hpp"

namespace pipetrain {
namespace {

using namespace testing;

void expect_identical(const RunResult& a, const RunResult& b) {
  EXPECT_EQ(a.losses, b.losses);
  for (const auto& [name, v] : b.params) EXPECT_EQ(a.params.at(name), v) << name;
}

TEST(RecomputeOnGrids, BitIdenticalOnEverySchedule) {
  if (world_size() != 2 && world_size() != 4) GTEST_SKIP() << "runs on 2 ranks (pp 2) and 4 (tp 2 x dp 2)";
  struct Case {
    const char* schedule;
    int virtual_stages;
  };
  std::vector<Case> cases = {{"gpipe", 1}, {"1f1b", 1}, {"zb-h1", 1}, {"interleaved-1f1b", 2}, {"zbv", 2},
                             {"dualpipev", 2}};
  if (world_size() == 4) cases = {{"1f1b", 1}, {"zb-h1", 1}};
  for (const Case& k : cases) {
    Config c = tiny_run_config();
    c.train.steps = 3;
    c.schedule.name = k.schedule;
    c.parallel.virtual_stages = k.virtual_stages;
    if (world_size() == 2) {
      c.parallel.pp = 2;
      // A fixed split: the auto split follows measured unit costs, which differ run to run
      // (under a sanitizer, enough to move a block), and the runs compare rank by rank.
      const int stages = c.parallel.pp * k.virtual_stages;
      c.parallel.layers_per_stage.assign(static_cast<size_t>(stages), double(c.model.n_layer) / stages);
    } else {
      c.parallel.tp = 2;
      c.parallel.dp = 2;
      c.train.microbatches = 4;  // per replica: the same global batch of 8
    }
    const RunResult none = run(c, MPI_COMM_WORLD);
    for (const char* mode : {"selective", "full"}) {
      SCOPED_TRACE(::testing::Message() << k.schedule << " on " << world_size() << " ranks, " << mode);
      Config r = c;
      r.train.recompute = mode;
      expect_identical(run(r, MPI_COMM_WORLD), none);
    }
    // Only the first stage (the one that holds most microbatches in flight).
    Config first = c;
    first.train.recompute = "full";
    first.parallel.recompute_stages = {0};
    SCOPED_TRACE(::testing::Message() << k.schedule << ", full on stage 0 only");
    expect_identical(run(first, MPI_COMM_WORLD), none);
  }
}

}  // namespace
}  // namespace pipetrain
