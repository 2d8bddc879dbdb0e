// The dense products' paths of a run (plan/product_choice.hpp) from times measured on this
// node: the model's weight shapes timed once by world rank 0 while the others wait (under
// a second on one core at GPT-2 124M's), or read back from a cache file that holds them for
// the same CPU, BLAS kernel, thread count and microbatch rows, so a restarted run takes the
// same paths (and the same bits). Every rank gets rank 0's times, so every rank chooses
// alike.
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/core/config.hpp"
#include "pipetrain/plan/product_choice.hpp"

namespace pipetrain {

// Microbatches of more rows are timed at this many (the products' time grows with the
// rows alike on every path; the choice is made on the rate).
inline constexpr int kTimedRowsMax = 256;

// Where a run keeps its times: beside its checkpoints ("" where checkpoint.dir is empty: not kept).
std::string product_times_cache(const Config& cfg);

// Writes `times` (timed at `rows` rows on this node, as kept) to the cache file `path`.
void save_product_times(const std::string& path, int rows, const std::vector<DenseProductTimes>& times);

// The shapes' times for products of `rows` rows; `cache` "" for none. `source` says where
// they came from ("timed in 0.41 s", "from <file>").
std::vector<DenseShapeUse> dense_product_times(const ModelConfig& model, int tp, Backend& backend, int rows,
                                               MPI_Comm world, const std::string& cache, std::string* source);

// runtime.dense_products and runtime.pack_weights resolved for `rows`-row microbatches
// used `uses_per_step` times a step, and applied to `backend` (an error where it cannot run
// what the user asked for). Timed only where there is a choice: the CPU, fp32 products,
// d_model >= kPackModelMin (below it the products are too small to time apart: the BLAS).
DenseChoice apply_dense_paths(const Config& cfg, Backend& backend, int tp, int rows, int uses_per_step, MPI_Comm world,
                              const std::string& cache);

}  // namespace pipetrain
