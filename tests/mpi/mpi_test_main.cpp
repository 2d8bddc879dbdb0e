// GoogleTest entry point for tests launched with mpiexec: MPI and Kokkos up, full
// output from rank 0, and at the end every rank's failures gathered to rank 0, which
// prints each with its rank and a verdict for the whole job. The exit status is the
// job's: non-zero on every rank when any rank failed, so the CTest entry fails; as the
// unit runner's (test_main.cpp), 77 (CTest: skipped) when no rank passed a test and some
// skipped (an mpi.npN entry whose grids stop matching its rank count), and 1 when the
// filter matched no test.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <string>
#include <vector>

#include "pipetrain/core/runtime_env.hpp"

namespace {

// Records this rank's failed assertions ("Suite.Test: file:line: message").
class FailureRecorder : public ::testing::EmptyTestEventListener {
 public:
  void OnTestStart(const ::testing::TestInfo& info) override {
    current_ = std::string(info.test_suite_name()) + "." + info.name();
  }
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    failures_ += current_ + ": " + (r.file_name() ? r.file_name() : "?") + ":" + std::to_string(r.line_number()) +
                 ": " + r.summary() + "\n";
    ++count_;
  }
  const std::string& text() const { return failures_; }
  int count() const { return count_; }

 private:
  std::string current_ = "(set-up)";
  std::string failures_;
  int count_ = 0;
};

// Rank 0 receives every rank's failure text and prints it, rank by rank.
int report(const FailureRecorder& rec, int rank, int size) {
  int mine[2] = {rec.count(), static_cast<int>(rec.text().size())};
  std::vector<int> all(2 * static_cast<size_t>(size));
  MPI_Gather(mine, 2, MPI_INT, all.data(), 2, MPI_INT, 0, MPI_COMM_WORLD);
  std::vector<int> lengths(static_cast<size_t>(size)), offsets(static_cast<size_t>(size));
  int total = 0;
  for (int r = 0; r < size; ++r) {
    lengths[static_cast<size_t>(r)] = all[2 * static_cast<size_t>(r) + 1];
    offsets[static_cast<size_t>(r)] = total;
    total += lengths[static_cast<size_t>(r)];
  }
  std::string text(static_cast<size_t>(total), '\0');
  MPI_Gatherv(rec.text().data(), mine[1], MPI_CHAR, text.data(), lengths.data(), offsets.data(), MPI_CHAR, 0,
              MPI_COMM_WORLD);
  int failures = 0;
  if (rank == 0) {
    std::string ranks;
    for (int r = 0; r < size; ++r) {
      const int n = all[2 * static_cast<size_t>(r)];
      if (n == 0) continue;
      failures += n;
      ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
      std::string part = text.substr(static_cast<size_t>(offsets[static_cast<size_t>(r)]),
                                     static_cast<size_t>(lengths[static_cast<size_t>(r)]));
      size_t start = 0;
      while (start < part.size()) {
        const size_t end = part.find('\n', start);
        std::fprintf(stderr, "[rank %d] %s\n", r, part.substr(start, end - start).c_str());
        start = end == std::string::npos ? part.size() : end + 1;
      }
    }
    if (failures > 0)
      std::fprintf(stderr, "MPI JOB FAILED: %d failed assertion(s) on rank(s) %s of %d\n", failures, ranks.c_str(),
                   size);
    else
      std::fprintf(stdout, "MPI JOB PASSED on all %d ranks\n", size);
    std::fflush(stderr);
    std::fflush(stdout);
  }
  MPI_Bcast(&failures, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return failures;
}

// With no failure anywhere: 1 when the filter matched nothing, 77 when every test any rank
// ran was skipped, else 0 (the same on every rank).
int verdict_without_failures(int rank) {
  const auto& unit = *::testing::UnitTest::GetInstance();
  int counts[2] = {unit.test_to_run_count(), unit.successful_test_count()};  // most over the ranks
  MPI_Allreduce(MPI_IN_PLACE, counts, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (counts[0] == 0) {
    if (rank == 0) std::fprintf(stderr, "MPI JOB FAILED: no test matched the filter\n");
    return 1;
  }
  if (counts[1] == 0) {
    if (rank == 0) std::fprintf(stdout, "MPI JOB SKIPPED: every test was skipped on every rank\n");
    return 77;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);  // as main: the progress thread
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) delete listeners.Release(listeners.default_result_printer());
  auto* recorder = new FailureRecorder;  // owned by GoogleTest
  listeners.Append(recorder);
  int rc = 0;
  {
    pipetrain::KokkosSession kokkos(argc, argv);
    rc = RUN_ALL_TESTS();
  }
  const int failures = report(*recorder, rank, size);
  int any = rc;
  MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  const int exit_code = any != 0 || failures != 0 ? 1 : verdict_without_failures(rank);
  MPI_Finalize();
  return exit_code;
}
