// Building token files (the format of pipetrain/io/token_dataset.hpp).
//
// Exports:
//   - TokenFileWriter: streams a known number of tokens into `out + ".tmp"` and renames
//     it to `out` on commit() (a failed or abandoned write leaves no `out` behind);
//   - write_token_file(): one call for tokens already in memory;
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

namespace pipetrain {

inline constexpr int32_t kLlmcMagic = 20240520;
inline constexpr int32_t kLlmcVersion = 1;
inline constexpr int kLlmcHeaderInts = 256;
inline constexpr int64_t kGpt2Vocab = 50257;
inline constexpr int64_t kTokenChunk = int64_t{1} << 20;  // tokens per HDF5 chunk

class TokenFileWriter {
 public:
  // Creates `out + ".tmp"` with a /tokens dataset of exactly `num_tokens` tokens: uint16
  // when vocab_size <= 65536, else uint32; attributes vocab_size and tokenizer.
  TokenFileWriter(std::string out, int64_t num_tokens, int64_t vocab_size, std::string tokenizer);
  // Without commit(): closes and deletes the temporary file.
  ~TokenFileWriter();
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;

  // Appends tokens (each must be < vocab_size; error names `out` and the position).
  void append(std::span<const uint16_t> tokens);
  void append(std::span<const uint32_t> tokens);
  int64_t written() const { return written_; }

  // Checks all num_tokens were written, closes the file and renames it to `out`.
  TokenFileInfo commit();

 private:
  template <typename T>
  void append_impl(std::span<const T> tokens, hid_t mem_type);
  void discard();

  std::string out_, tmp_, tokenizer_, dtype_;
  int64_t total_ = 0, written_ = 0, vocab_ = 0;
  bool committed_ = false;
  h5io::Id file_, dataset_;
};

// Writes `tokens` to `out` (atomically: `out.tmp`, then rename).
TokenFileInfo write_token_file(const std::string& out, std::span<const uint32_t> tokens,
                               int64_t vocab_size, const std::string& tokenizer);

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
