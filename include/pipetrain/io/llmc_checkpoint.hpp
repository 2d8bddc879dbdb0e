// llm.c GPT-2 model files (train_gpt2.py's write_model) <-> pipetrain checkpoints.
//
// llm.c format: a header of 256 little-endian int32 ([0] magic 20240326, [1] version:
// 3 = fp32, 5 = bf16 (the upper 16 bits of fp32), [2] maxT, [3] V, [4] L, [5] NH,
// [6] C, [7] Vp = V padded to a multiple of 128; the rest 0), then every parameter
// contiguous, all layers of one kind together:
//   wte (Vp,C) wpe (maxT,C) ln1w (L,C) ln1b (L,C) qkvw (L,3C,C) qkvb (L,3C)
//   attprojw (L,C,C) attprojb (L,C) ln2w (L,C) ln2b (L,C) fcw (L,4C,C) fcb (L,4C)
//   fcprojw (L,C,4C) fcprojb (L,C) lnfw (C) lnfb (C)
// Linear weights are (out, in) in both formats, so the values map one to one (the
// padded rows of wte included) onto pipetrain's "params/<name>" datasets.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "pipetrain/core/config.hpp"

namespace pipetrain {

inline constexpr int32_t kLlmcModelMagic = 20240326;
inline constexpr int32_t kLlmcVersionFp32 = 3;
inline constexpr int32_t kLlmcVersionBf16 = 5;
inline constexpr int64_t kLlmcHeaderInts = 256;

// One pipetrain parameter and where its values lie in llm.c's parameter array.
struct LlmcTensor {
  std::string name;            // pipetrain parameter name, e.g. "h.1.attn.qkv.w"
  std::vector<int64_t> shape;  // its (global) shape
  int64_t offset = 0;          // first element in the llm.c parameter array
};

// Every parameter of the GPT-2 `model`, in the model's declaration order (wte, wpe,
// h.0.*, ..., lnf.*), with its llm.c offset; the last one ends at llmc_num_params.
std::vector<LlmcTensor> llmc_layout(const ModelConfig& model);
int64_t llmc_num_params(const ModelConfig& model);

// Reads the llm.c file `bin` (version 3 or 5) and writes its weights as a pipetrain
// checkpoint `out_h5` (params only, step 0, grid 1x1x1). Single process: uses
// MPI_COMM_SELF (MPI must be initialised). Returns the model read. Throws
// pipetrain::Error naming the file: missing, bad magic, unsupported version,
// impossible header, truncated or oversized file.
ModelConfig import_llmc(const std::string& bin, const std::string& out_h5);

// Writes the params of the pipetrain checkpoint `h5` as an llm.c fp32 (version 3)
// file `out_bin` (via a temporary file, renamed when complete). Single process
// (MPI_COMM_SELF). Throws naming the file (and the tensor when one is missing or has
// another shape than the stored config's model needs).
ModelConfig export_llmc(const std::string& h5, const std::string& out_bin);

}  // namespace pipetrain
