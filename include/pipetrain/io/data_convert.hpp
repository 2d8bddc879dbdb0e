// Building token files (the format of pipetrain/io/token_dataset.hpp).
//
// Exports (the writer they share is token_writer.hpp):
//   - convert_text(): byte-level tokenizer (each byte is a token, vocab 256, "byte");
//   - tokenize_text(): any Tokenizer (io/tokenizer.hpp), streamed in bounded memory, an
//     optional end-of-text token between files (data_convert_text.cpp);
//   - convert_llmc(): llm.c GPT-2 token shards (magic 20240520, version 1, uint16);
//   - convert_raw(): headerless little-endian uint16/uint32 token arrays;
//   - convert_megatron(): Megatron-LM indexed datasets (PREFIX.bin + PREFIX.idx).
// Every converter concatenates its inputs in order, checks them completely before
// writing, and throws pipetrain::Error naming the offending input.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "pipetrain/io/megatron_dataset.hpp"
#include "pipetrain/io/token_dataset.hpp"
#include "pipetrain/io/token_writer.hpp"
#include "pipetrain/io/tokenizer.hpp"

namespace pipetrain {

inline constexpr int32_t kLlmcMagic = 20240520;
inline constexpr int32_t kLlmcVersion = 1;
inline constexpr int kLlmcHeaderInts = 256;
inline constexpr int64_t kGpt2Vocab = 50257;

// Each byte of the inputs is one token; vocab 256, tokenizer "byte", stored as uint16.
TokenFileInfo convert_text(const std::vector<std::string>& inputs, const std::string& out);

// How far tokenize_text has come (called after each block of text).
struct TextProgress {
  int64_t bytes_done = 0, bytes_total = 0, tokens = 0;
};

// The inputs' text through `tok`, in order, with tok's end-of-text token after each file
// when `eot` (an error when the vocabulary has none). Reads blocks of a few MiB and cuts
// them where encoding in parts gives the same ids (stream_split), so memory stays bounded
// by the block plus the longest stretch without such a place. The dataset records
// tok.name() and tok.vocab_size(). Errors name the file (missing, not UTF-8 for BPE).
TokenFileInfo tokenize_text(const std::vector<std::string>& inputs, const std::string& out, const Tokenizer& tok,
                            bool eot, const std::function<void(const TextProgress&)>& progress = {},
                            size_t block_bytes = size_t{4} << 20);

// The same over the ranks of `comm` (collective; one rank: tokenize_text): each rank
// tokenizes its slice of the inputs' bytes (cut where encoding in parts gives the same ids)
// into a temporary file beside `out`, then every rank writes its ids at their place in one
// collective parallel-HDF5 pass. An error on any rank fails every rank before anything
// is written.
TokenFileInfo tokenize_text_parallel(MPI_Comm comm, const std::vector<std::string>& inputs, const std::string& out,
                                     const Tokenizer& tok, bool eot,
                                     const std::function<void(const TextProgress&)>& progress = {});

// llm.c shards: 256 little-endian int32 header (magic 20240520, version 1, token count),
// then that many little-endian uint16 tokens. vocab 50257, tokenizer "gpt2".
TokenFileInfo convert_llmc(const std::vector<std::string>& shards, const std::string& out);

// A Megatron-LM indexed dataset (io/megatron_dataset.hpp). vocab_size 0: the largest
// token + 1. The documents are not kept (HDF5 token files have none).
TokenFileInfo convert_megatron(const std::string& prefix, const std::string& out, int64_t vocab_size = 0,
                               const std::string& tokenizer = "unknown");

// Headerless little-endian arrays; dtype "u16" or "u32"; every token must be < vocab_size.
TokenFileInfo convert_raw(const std::vector<std::string>& inputs, const std::string& out,
                          const std::string& dtype, int64_t vocab_size,
                          const std::string& tokenizer = "unknown");

}  // namespace pipetrain
