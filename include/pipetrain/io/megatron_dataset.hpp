// Megatron-LM indexed datasets (`PREFIX.bin` + `PREFIX.idx`), read in place.
//
// The index (`MMIDIDX` format, version 1, little-endian): the 9-byte magic "MMIDIDX\0\0",
// the version (uint64 = 1), the token dtype code (uint8: 1 uint8, 2 int8, 3 int16,
// 4 int32, 5 int64, 8 uint16; 6 and 7 are floats, not tokens), the sequence count S and
// the document-index count D (uint64 each), then S sequence lengths (int32), S byte
// offsets into the .bin (int64) and D document indices (int64: document d is sequences
// [doc[d], doc[d+1])). The .bin holds the sequences' tokens back to back; it is
// memory-mapped, never converted.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace pipetrain {

class MegatronDataset {
 public:
  // Opens and checks PREFIX.idx and PREFIX.bin: magic, version, dtype, counts against the
  // file sizes, sequences contiguous in the .bin, document indices increasing from 0 to S.
  // Throws pipetrain::Error naming the file.
  explicit MegatronDataset(const std::string& prefix);
  ~MegatronDataset();
  MegatronDataset(const MegatronDataset&) = delete;
  MegatronDataset& operator=(const MegatronDataset&) = delete;

  // Whether PREFIX.idx exists (a data path names a Megatron dataset).
  static bool exists(const std::string& prefix);

  const std::string& prefix() const { return prefix_; }
  int64_t num_tokens() const { return tokens_; }
  const std::string& dtype() const { return dtype_; }  // "uint16", "int32", ...
  // The first token of every document, and num_tokens() at the end (D entries).
  const std::vector<int64_t>& document_starts() const { return doc_starts_; }
  // Tokens [first, first + count) as int32; a negative token (signed dtypes) or one at or
  // above 2^31 is an error naming the file and the position.
  void read(int64_t first, int64_t count, int32_t* out) const;

 private:
  std::string prefix_, dtype_;
  int width_ = 0;
  bool signed_ = false;
  int64_t tokens_ = 0;
  std::vector<int64_t> doc_starts_;
  const unsigned char* data_ = nullptr;  // the mapped .bin
  size_t mapped_ = 0;
};

}  // namespace pipetrain
