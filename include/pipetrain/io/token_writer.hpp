// Writing token files (the format of pipetrain/io/token_dataset.hpp), durably:
//   - TokenFileWriter: streams a known number of tokens into `out + ".tmp"` and renames
//     it to `out` on commit() (a failed or abandoned write leaves no `out` behind);
//   - write_token_file(): one call for tokens already in memory.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <span>
#include <string>

#include "pipetrain/io/h5io.hpp"
#include "pipetrain/io/token_dataset.hpp"

namespace pipetrain {

inline constexpr int64_t kTokenChunk = int64_t{1} << 20;  // tokens per HDF5 chunk
inline constexpr int64_t kTokensNotKnown = -1;             // TokenFileWriter: the count is what gets appended

class TokenFileWriter {
 public:
  // Creates `out + ".tmp"` with a /tokens dataset of exactly `num_tokens` tokens: uint16
  // when vocab_size <= 65536, else uint32; attributes vocab_size and tokenizer. With
  // kTokensNotKnown the dataset grows as tokens are appended (a tokenizer's output).
  TokenFileWriter(std::string out, int64_t num_tokens, int64_t vocab_size, std::string tokenizer);
  // Collective over `comm` (parallel HDF5): every rank passes the same arguments, with
  // num_tokens the total; each rank then writes its part with write_part() and commit()
  // is collective (rank 0 renames the file into place).
  TokenFileWriter(std::string out, int64_t num_tokens, int64_t vocab_size, std::string tokenizer, MPI_Comm comm);
  // Without commit(): closes and deletes the temporary file.
  ~TokenFileWriter();
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;

  // Appends tokens (each must be < vocab_size; error names `out` and the position).
  void append(std::span<const uint16_t> tokens);
  void append(std::span<const uint32_t> tokens);
  int64_t written() const { return written_; }

  // Collective: this rank's tokens at stream positions [first, first + size). Every rank
  // calls it the same number of times (with no tokens when it has none left).
  void write_part(int64_t first, std::span<const uint32_t> tokens);

  // Checks all num_tokens were written, closes the file and renames it to `out`.
  TokenFileInfo commit();

 private:
  template <typename T>
  void append_impl(std::span<const T> tokens, hid_t mem_type);
  void discard();

  std::string out_, tmp_, tokenizer_, dtype_;
  int64_t total_ = 0, written_ = 0, vocab_ = 0;
  bool committed_ = false, growing_ = false;
  MPI_Comm comm_ = MPI_COMM_NULL;  // collective mode
  h5io::Id file_, dataset_;
};

// Writes `tokens` to `out` (atomically: `out.tmp`, then rename).
TokenFileInfo write_token_file(const std::string& out, std::span<const uint32_t> tokens,
                               int64_t vocab_size, const std::string& tokenizer);

}  // namespace pipetrain
