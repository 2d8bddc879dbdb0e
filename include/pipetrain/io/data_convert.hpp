// Building token files (the format of pipetrain/io/token_dataset.hpp).
//
// Exports (the writer they share is token_writer.hpp):
//   - convert_text(): byte-level tokenizer (each byte is a token, vocab 256, "byte");
//   - convert_llmc(): llm.c GPT-2 token shards (magic 20240520, version 1, uint16);
//   - convert_raw(): headerless little-endian uint16/uint32 token arrays.
// Every converter concatenates its inputs in order, checks them completely before
// writing, and throws pipetrain::Error naming the offending input.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "pipetrain/io/token_dataset.hpp"
#include "pipetrain/io/token_writer.hpp"

namespace pipetrain {

inline constexpr int32_t kLlmcMagic = 20240520;
inline constexpr int32_t kLlmcVersion = 1;
inline constexpr int kLlmcHeaderInts = 256;
inline constexpr int64_t kGpt2Vocab = 50257;

// Each byte of the inputs is one token; vocab 256, tokenizer "byte", stored as uint16.
TokenFileInfo convert_text(const std::vector<std::string>& inputs, const std::string& out);

// llm.c shards: 256 little-endian int32 header (magic 20240520, version 1, token count),
// then that many little-endian uint16 tokens. vocab 50257, tokenizer "gpt2".
TokenFileInfo convert_llmc(const std::vector<std::string>& shards, const std::string& out);

// Headerless little-endian arrays; dtype "u16" or "u32"; every token must be < vocab_size.
TokenFileInfo convert_raw(const std::vector<std::string>& inputs, const std::string& out,
                          const std::string& dtype, int64_t vocab_size,
                          const std::string& tokenizer = "unknown");

}  // namespace pipetrain
