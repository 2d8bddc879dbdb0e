// HDF5 checkpoints. One file per checkpoint, written collectively with parallel HDF5
// (MPI-IO): every tensor is stored at its global, unsharded shape under a stable name
// ("params/h.3.attn.qkv.w", "adam_m/...", "adam_v/..."), each rank writing its own
// hyperslab, so nothing in the file depends on the grid that wrote it. Every dataset
// is chunked with HDF5's Fletcher32 checksum filter, verified on every read. The file
// is written under a temporary name and renamed once complete; `<dir>/latest` names the
// newest complete checkpoint and is replaced atomically after that.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "pipetrain/core/error.hpp"
#include "pipetrain/core/grid_shape.hpp"
#include "pipetrain/core/shard.hpp"

namespace pipetrain {

inline constexpr int kCheckpointFormatVersion = 1;

// A checkpoint that cannot be read back as written: missing, not HDF5, not a pipetrain
// checkpoint, or a dataset failing its checksum. `--resume auto` skips such files;
// other errors (a checkpoint of another model) stop the run.
class CheckpointUnreadable : public Error {
 public:
  using Error::Error;
};

struct CheckpointMeta {
  int format_version = kCheckpointFormatVersion;
  int64_t step = 0;         // the next step to run
  int64_t tokens_seen = 0;  // tokens trained on so far
  int64_t samples_seen = 0; // position in the data stream (global sample index)
  uint64_t seed = 0;        // initialisation and shuffling seed (the only randomness)
  std::string config_toml;  // the full config of the run
  GridShape grid;           // the run's grid (cp and ep absent in older files: 1)
  bool zero1 = false;
  std::string schedule;
  std::string tokenizer;  // the training data's tokenizer ("" when unknown; optional attribute)
};

// One tensor as this rank sees it. `data` is this rank's shard (local layout) to write
// from or read into; `write` says whether this rank writes it (exactly one holder of
// every element writes; the others pass false and still take part collectively).
struct CheckpointTensor {
  std::string name;  // dataset path, e.g. "params/wte"
  std::vector<int64_t> global_shape;
  Shard shard;
  float* data = nullptr;
  bool write = false;
  // Only the elements [flat_begin, flat_end) of the local shard (row-major), which
  // `data` points at — a ZeRO-1 rank's slice of the optimizer moments. -1: the whole shard.
  int64_t flat_begin = 0, flat_end = -1;
  bool partial() const { return flat_end >= 0; }
};

// Collective over `comm`: every rank passes the same tensor names in the same order.
// Writes `path` + ".tmp", then rank 0 renames it to `path`.
void write_checkpoint(const std::string& path, MPI_Comm comm, const CheckpointMeta& meta,
                      const std::vector<CheckpointTensor>& tensors);

// Any rank, alone. Throws CheckpointUnreadable naming the file: missing, not HDF5, not a
// pipetrain checkpoint, unsupported format version.
CheckpointMeta read_checkpoint_meta(const std::string& path);

// Collective over `comm`: reads each tensor's shard into `data` (tensors with
// data == nullptr are skipped by this rank). Throws pipetrain::Error naming the dataset
// on a missing tensor or a shape mismatch, CheckpointUnreadable on a file that cannot be
// opened or a checksum failure (only the chunks this rank reads are verified).
void read_checkpoint_tensors(const std::string& path, MPI_Comm comm, const std::vector<CheckpointTensor>& tensors);

struct CheckpointEntry {
  std::string name;
  std::vector<int64_t> shape;
};
// Every dataset (name and shape), in file order.
std::vector<CheckpointEntry> list_checkpoint(const std::string& path);

// Reads every dataset in full; returns the names whose checksum (or read) fails.
std::vector<std::string> verify_checkpoint(const std::string& path);

// Checkpoint files in `dir` (step_*.h5), newest first.
std::vector<std::string> checkpoints_in(const std::string& dir);
std::string checkpoint_path(const std::string& dir, int64_t step);
// Points `<dir>/latest` at `file` atomically (write a temporary file, rename).
void update_latest(const std::string& dir, const std::string& file);
// Removes all but the newest `keep` checkpoints of `dir`.
void prune_checkpoints(const std::string& dir, int keep);

}  // namespace pipetrain
