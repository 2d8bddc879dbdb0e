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

int32_t end_of_text_of(const std::string& tokenizer, const std::string& path) {
  if (tokenizer.empty())
    fail(
        "{}: data.pack_documents finds an HDF5 file's documents by its tokenizer's end-of-text token, and the "
        "file records no tokenizer (write it with `pipetrain data text --eot`)",
        path);
  const std::optional<int32_t> eot = make_tokenizer(tokenizer)->end_of_text();
  if (!eot)
    fail("{}: data.pack_documents: tokenizer {} has no end-of-text token to find documents by", path, tokenizer);
  return *eot;
}

}  // namespace

std::vector<int64_t> TokenDataset::document_boundaries() {
  std::vector<int64_t> starts;
  std::vector<int32_t> chunk;
  for (const File& f : files_) {
    if (f.megatron) {
      const std::vector<int64_t>& docs = f.megatron->document_starts();  // ends with the file's size
      for (size_t d = 0; d + 1 < docs.size(); ++d) starts.push_back(f.first + docs[d]);
      continue;
    }
    const int32_t eot = end_of_text_of(tokenizer_, f.path);
    padding_token_ = eot;
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
