#include "pipetrain/runtime/resume.hpp"

#include <mpi.h>

#include <climits>
#include <fmt/format.h>
#include <sstream>

#include "pipetrain/io/checkpoint.hpp"

namespace pipetrain {

namespace {

// Rank 0's value of `text` on every rank.
std::string broadcast(std::string text, int root, MPI_Comm comm) {
  int len = static_cast<int>(text.size());
  MPI_Bcast(&len, 1, MPI_INT, root, comm);
  text.resize(static_cast<size_t>(len));
  MPI_Bcast(text.data(), len, MPI_CHAR, root, comm);
  return text;
}

}  // namespace

ResumeResult resume_newest(Trainer& trainer, Grid& grid, const std::string& dir,
                           const std::function<void(const std::string&, const std::string&)>& skipped) {
  MPI_Comm comm = grid.world().comm();
  const int rank = grid.world_rank();
  // One listing (rank 0's), so every rank tries the same files in the same order.
  std::string listing;
  if (rank == 0)
    for (const auto& p : checkpoints_in(dir)) listing += p + "\n";
  listing = broadcast(listing, 0, comm);
  std::istringstream candidates(listing);
  for (std::string path; std::getline(candidates, path);) {
    std::string why;
    int64_t step = 0;
    try {
      step = trainer.load_checkpoint(path, false);
    } catch (const CheckpointUnreadable& e) {
      why = e.what();
    }
    int failed = why.empty() ? INT_MAX : rank;  // the lowest rank that failed reports
    MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MIN, comm);
    if (failed == INT_MAX) return {path, step};
    why = broadcast(why, failed, comm);
    if (rank == 0 && skipped) skipped(path, grid.world_size() > 1 ? fmt::format("{} (rank {})", why, failed) : why);
  }
  return {};
}

}  // namespace pipetrain
