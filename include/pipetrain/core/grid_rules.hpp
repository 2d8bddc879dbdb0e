// Which grids can split a model and its batch: each rule once, here and nowhere else,
// used by validate_config (which names the file), the Grid (the shape on the job's
// ranks), the planner (which skips a candidate that breaks one) and the layers and
// trainer that split (as a guard for configs built in code). Each returns "" when the
// split works, else one line naming the keys. grid_problem holds them all.
#pragma once
#include <cstdint>
#include <string>

#include "pipetrain/core/config.hpp"

namespace pipetrain {

// parallel.tp: every rank holds whole heads, whole key/value heads, an equal slice of the
// MLP width (Llama) and of the padded vocabulary.
std::string tp_split_problem(const ModelConfig& m, int tp);
// parallel.pp * parallel.virtual_stages with no explicit split: each stage needs a block.
std::string stage_split_problem(const ModelConfig& m, int64_t stages);
// parallel.vocab_parallel: `slices` (pp x tp) equal slices of the padded vocabulary.
std::string vocab_split_problem(const ModelConfig& m, int slices);
// Everything parallel.vocab_parallel needs of a run: the slices above, a CPU device, a
// built-in schedule (a file's program has no slices) and MPI's transfers (NCCL's in-order
// ones cannot run its collectives yet). `true` refuses the first that fails; "auto" turns
// the slices off and says why.
std::string vocab_parallel_problem(const Config& cfg);
// parallel.sequence_parallel: whether a run splits its activations by rows over its tp
// ranks (true with tp > 1; "auto" where tp also divides train.seq_len / parallel.cp), and
// the rule `true` needs: tp divides those tokens (each rank an equal share of the rows).
bool sequence_parallel_on(const Config& cfg);
bool sequence_parallel_on(Toggle sequence_parallel, const GridShape& g, int seq_len);
std::string sequence_parallel_problem(const Config& cfg);
// parallel.shard = "gradients" | "weights": what the unit shards do not take in this version
// (the GPU, packed weights under "weights") and a shard group that splits a run of ep ranks.
std::string shard_problem(const Config& cfg);
// parallel.cp: every sequence cut into 2 cp equal chunks, and what context parallelism
// does not run with yet (mixtures of experts).
std::string context_parallel_problem(const Config& cfg);
std::string context_parallel_problem(const ModelConfig& m, int seq_len, int cp);
// parallel.ep: experts to split, whole experts on each of ep consecutive dp ranks, and
// (with any experts) their width split over tp.
std::string expert_parallel_problem(const ModelConfig& m, const GridShape& g);
// Every rule of a config's grid, the first that fails: the shape (each dimension >= 1, ep
// dividing dp), tp's split of the model, sequence, context and expert parallelism, the
// vocabulary slices (parallel.vocab_parallel = true) and, without parallel.layers_per_stage,
// the stages. (The batch's split, batch_split_problem, is train.*'s rule.)
std::string grid_problem(const Config& cfg);
// The shape itself on a job of `ranks` ranks: every dimension at least 1, ep dividing dp,
// dp x pp x cp x tp equal to the ranks (not checked for ranks < 0: a config alone).
std::string grid_shape_problem(const GridShape& g, int64_t ranks = -1);
// train.global_batch into dp replicas of `microbatches` equal microbatches.
std::string batch_split_problem(int64_t global_batch, int dp, int microbatches);

}  // namespace pipetrain
