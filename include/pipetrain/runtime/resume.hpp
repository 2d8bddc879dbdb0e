// `--resume auto`: continue from the newest checkpoint of a directory that reads back
// intact, in about the time of reading it once.
//
// Loading is the verification: every chunk is checked against its Fletcher32 checksum
// as it is read (HDF5's own filter), each rank reads its share of the file — its
// stage's, tensor-parallel slice's and ZeRO-1 slice's tensors — and together the ranks
// read all of it. If any rank's read fails, every rank moves on to the next older file,
// whose load overwrites whatever the failed one had filled in.
#pragma once
#include <functional>
#include <string>

#include "pipetrain/runtime/trainer.hpp"

namespace pipetrain {

struct ResumeResult {
  std::string path;  // "" when no checkpoint of the directory could be read
  int64_t step = 0;  // the step to continue from
};

// Collective over the trainer's grid. `skipped(path, why)` is called on rank 0 for each
// newer file that could not be read (why names the dataset and the rank that failed).
// Errors other than unreadable files (a checkpoint of another model) are thrown.
ResumeResult resume_newest(Trainer& trainer, Grid& grid, const std::string& dir,
                           const std::function<void(const std::string&, const std::string&)>& skipped = {});

}  // namespace pipetrain
