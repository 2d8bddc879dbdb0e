// Token datasets on disk (HDF5); batch_sampler.hpp turns them into batches.
//
// Exports:
//   - the file format constants (kTokensDataset, kVocabAttr, kTokenizerAttr);
//   - TokenFileInfo + inspect_token_file(): what one token file holds;
//   - TokenDataset: a list of token files read as one stream, cut into windows, or into
//     sequences of whole documents (data.pack_documents; io/document_packing.hpp).
//
// File format: a 1-D dataset `/tokens` of uint16 (vocab <= 65536) or uint32, chunked;
// attributes `vocab_size` (int64) and `tokenizer` (string) on the root group. Readers
// also accept the attributes on `/tokens`, and files without them (vocab unknown).
#pragma once
#include <hdf5.h>
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pipetrain/core/documents.hpp"
#include "pipetrain/io/document_packing.hpp"
#include "pipetrain/io/h5io.hpp"
#include "pipetrain/io/megatron_dataset.hpp"

namespace pipetrain {

inline constexpr const char* kTokensDataset = "tokens";
inline constexpr const char* kVocabAttr = "vocab_size";
inline constexpr const char* kTokenizerAttr = "tokenizer";

// What one token file holds, as read from its dataset and attributes.
struct TokenFileInfo {
  std::string path;
  int64_t num_tokens = 0;
  int64_t vocab_size = 0;  // 0 = the file has no vocab_size attribute
  std::string tokenizer;   // "" = the file has no tokenizer attribute
  std::string dtype;       // "uint16" or "uint32"
};

// Opens `path`, checks /tokens, reads the attributes. Throws pipetrain::Error naming
// the file (no such file, not an HDF5 file, no /tokens, wrong rank or type).
TokenFileInfo inspect_token_file(const std::string& path);

// A list of token files read as one stream (file 0's tokens, then file 1's, ...). A
// path that is not a file but has PREFIX.idx beside it is a Megatron indexed dataset
// (io/megatron_dataset.hpp), memory-mapped. Every file stays open for the object's
// life. Not thread-safe.
class TokenDataset {
 public:
  // Opens every file, checks /tokens exists and is 1-D uint16/uint32, reads attributes.
  // model_vocab: tokens must be < model_vocab (error if a file's vocab_size exceeds it).
  // seq_len: a window is seq_len+1 tokens; window w starts at token w*seq_len;
  // n = floor((N-1)/seq_len) windows (N = total tokens over all files).
  // respect_documents: windows lie inside documents only (each document of L tokens
  // gives floor((L-1)/seq_len) windows from its start); every source must know its
  // documents (Megatron datasets do; HDF5 token files do not).
  // pack_documents: each window is instead a packed sequence of whole documents
  // (io/document_packing.hpp): a Megatron source's documents, or an HDF5 file's, each
  // ending at its tokenizer's end-of-text token (`pipetrain data text --eot` writes one
  // after each input file), read once here. scan_comm: the ranks opening the same files
  // together (collective over them when packing): the first reads the files for their
  // documents and gives the others the boundaries, so a job reads its data once at start-up.
  TokenDataset(const std::vector<std::string>& files, int seq_len, int model_vocab, bool respect_documents = false,
               bool pack_documents = false, MPI_Comm scan_comm = MPI_COMM_SELF);
  ~TokenDataset();
  TokenDataset(const TokenDataset&) = delete;
  TokenDataset& operator=(const TokenDataset&) = delete;

  int64_t num_tokens() const { return total_; }
  int64_t num_windows() const { return windows_; }
  int seq_len() const { return seq_len_; }
  // The largest vocab_size attribute over the files; 0 if none has one.
  int vocab_size() const { return vocab_; }
  // The files' tokenizer attribute ("" if none has one; all files must agree).
  const std::string& tokenizer() const { return tokenizer_; }
  const std::vector<std::string>& files() const { return paths_; }

  int64_t window_start(int64_t w) const { return starts_.empty() ? w * seq_len_ : starts_[static_cast<size_t>(w)]; }
  // Reads window w's seq_len+1 tokens (may span a file boundary) as int32 into out.
  // Throws pipetrain::Error naming file and position if any token >= model_vocab.
  void read_window(int64_t w, int32_t* out) const;
  // Window w as a training sample of seq_len positions: inputs[t], the targets[t] they
  // predict (kIgnoredTarget, core/documents.hpp, where none counts: after a packed document's last token and
  // on padding), and positions[t], each token's place in its document (t - the position
  // its document starts at in the window; t when not packed). Any pointer may be null.
  void read_sample(int64_t w, int32_t* inputs, int32_t* targets, int32_t* positions) const;
  // Targets of window w that count (seq_len when not packed).
  int64_t targets_in(int64_t w) const { return packing_ ? packing_->targets(w) : seq_len_; }
  const DocumentPacking* packing() const { return packing_.get(); }
  // Reads tokens [first, first+count) of the stream into out (checked like read_window).
  void read_tokens(int64_t first, int64_t count, int32_t* out) const;

 private:
  struct File {
    std::string path;
    h5io::Id file, dataset;
    std::unique_ptr<MegatronDataset> megatron;  // set for a Megatron source
    int64_t first = 0;  // index of this file's token 0 in the stream
    int64_t count = 0;
  };
  std::vector<std::string> paths_;
  std::vector<File> files_;
  int seq_len_ = 0;
  int model_vocab_ = 0;
  int vocab_ = 0;
  std::string tokenizer_;
  int64_t total_ = 0;
  int64_t windows_ = 0;
  std::vector<int64_t> starts_;  // respect_documents: each window's first token
  std::unique_ptr<DocumentPacking> packing_;
  int32_t padding_token_ = 0;  // the inputs of packed sequences' free positions

  // For pack_documents: where every document starts (the first of `comm` reads, the others
  // receive); sets padding_token_.
  std::vector<int64_t> document_boundaries(MPI_Comm comm);
  std::vector<int64_t> scan_documents() const;  // this rank reading every file
  void read_packed(int64_t w, int32_t* inputs, int32_t* targets, int32_t* positions) const;
};

}  // namespace pipetrain
