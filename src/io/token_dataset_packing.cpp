// TokenDataset's packed sequences (data.pack_documents; pipetrain/io/token_dataset.hpp):
// where every source's documents start, and reading a sequence of whole documents.
#include <algorithm>
#include <optional>

#include "pipetrain/core/error.hpp"
#include "pipetrain/io/token_dataset.hpp"
#include "pipetrain/io/tokenizer.hpp"

namespace pipetrain {
namespace {

constexpr int64_t kScanChunk = int64_t{1} << 20;  // tokens read at a time looking for end-of-text

// From the tokenizer's name alone: a ranks file need not be where `data text` read it.
int32_t document_end(const std::string& tokenizer, const std::string& path) {
  if (tokenizer.empty())
    fail(
        "{}: data.pack_documents finds an HDF5 file's documents by its tokenizer's end-of-text token, and the "
        "file records no tokenizer (write it with `pipetrain data text --eot`)",
        path);
  const std::optional<int32_t> eot = end_of_text_of(tokenizer);
  if (!eot)
    fail("{}: data.pack_documents: tokenizer {} has no end-of-text token to find documents by", path, tokenizer);
  return *eot;
}

}  // namespace

std::vector<int64_t> TokenDataset::document_boundaries(MPI_Comm comm) {
  // Every rank checks the files' tokenizers (a missing end-of-text token is every rank's
  // one-line error, before any rank waits for the boundaries).
  for (const File& f : files_)
    if (!f.megatron) padding_token_ = document_end(tokenizer_, f.path);
  int rank = 0, size = 1;
  if (comm != MPI_COMM_SELF) {  // (one rank alone needs no MPI, initialised or not)
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
  }
  std::vector<int64_t> starts;
  if (rank == 0) starts = scan_documents();
  if (size == 1) return starts;
  int64_t n = static_cast<int64_t>(starts.size());
  MPI_Bcast(&n, 1, MPI_INT64_T, 0, comm);
  starts.resize(static_cast<size_t>(n));
  constexpr int64_t kPiece = int64_t{1} << 26;  // counts are ints: broadcast in pieces
  for (int64_t at = 0; at < n; at += kPiece)
    MPI_Bcast(starts.data() + at, static_cast<int>(std::min(kPiece, n - at)), MPI_INT64_T, 0, comm);
  return starts;
}

std::vector<int64_t> TokenDataset::scan_documents() const {
  std::vector<int64_t> starts;
  std::vector<int32_t> chunk;
  for (const File& f : files_) {
    if (f.megatron) {
      const std::vector<int64_t>& docs = f.megatron->document_starts();  // ends with the file's size
      for (size_t d = 0; d + 1 < docs.size(); ++d) starts.push_back(f.first + docs[d]);
      continue;
    }
    const int32_t eot = document_end(tokenizer_, f.path);
    starts.push_back(f.first);
    chunk.resize(static_cast<size_t>(std::min(kScanChunk, f.count)));
    for (int64_t at = 0; at < f.count; at += kScanChunk) {
      const int64_t n = std::min(kScanChunk, f.count - at);
      read_tokens(f.first + at, n, chunk.data());
      for (int64_t i = 0; i < n; ++i)
        if (chunk[static_cast<size_t>(i)] == eot && at + i + 1 < f.count) starts.push_back(f.first + at + i + 1);
    }
  }
  starts.push_back(total_);
  return starts;
}

void TokenDataset::read_packed(int64_t w, int32_t* inputs, int32_t* targets, int32_t* positions) const {
  if (w < 0 || w >= windows_) fail("sequence {} out of range: the dataset packs {} sequences", w, windows_);
  std::vector<int32_t> tokens(static_cast<size_t>(seq_len_) + 1);
  const bool read = inputs || targets;
  int t = 0;
  for (const PackedPiece& p : packing_->pieces(w)) {
    const int64_t n = p.length + (p.last_target ? 1 : 0);
    if (read) read_tokens(p.first, n, tokens.data());
    for (int i = 0; i < p.length; ++i, ++t) {
      if (inputs) inputs[t] = tokens[static_cast<size_t>(i)];
      if (targets) targets[t] = i + 1 < n ? tokens[static_cast<size_t>(i) + 1] : kIgnoredTarget;
      if (positions) positions[t] = i;
    }
  }
  for (int i = 0; t < seq_len_; ++i, ++t) {  // padding: a document of its own that nothing predicts
    if (inputs) inputs[t] = padding_token_;
    if (targets) targets[t] = kIgnoredTarget;
    if (positions) positions[t] = i;
  }
}

}  // namespace pipetrain
