// DocumentPacking (pipetrain/io/document_packing.hpp): documents placed in stream order.
#include "pipetrain/io/document_packing.hpp"

#include <algorithm>

#include "pipetrain/core/error.hpp"

namespace pipetrain {

DocumentPacking::DocumentPacking(std::span<const int64_t> boundaries, int seq_len) : seq_len_(seq_len) {
  if (seq_len < 1) fail("seq_len must be at least 1, got {}", seq_len);
  for (size_t d = 0; d + 1 < boundaries.size(); ++d) {
    const int64_t begin = boundaries[d], end = boundaries[d + 1];
    if (end < begin) fail("document boundaries must ascend: {} after {}", end, begin);
    if (end == begin) continue;
    ++documents_;
    if (end - begin > seq_len) ++split_;
    for (int64_t at = begin; at < end; at += seq_len) {
      PackedPiece p;
      p.first = at;
      p.length = static_cast<int32_t>(std::min<int64_t>(seq_len, end - at));
      p.last_target = at + p.length < end;
      if (p.targets() > 0) place(p);
    }
  }
  if (fill_ > 0) starts_.push_back(static_cast<int64_t>(pieces_.size()));
}

void DocumentPacking::place(PackedPiece piece) {
  if (fill_ + piece.length > seq_len_) {
    starts_.push_back(static_cast<int64_t>(pieces_.size()));
    fill_ = 0;
  }
  pieces_.push_back(piece);
  fill_ += piece.length;
  filled_ += piece.length;
}

std::span<const PackedPiece> DocumentPacking::pieces(int64_t sequence) const {
  if (sequence < 0 || sequence >= num_sequences())
    fail("packed sequence {} out of range: there are {}", sequence, num_sequences());
  const auto s = static_cast<size_t>(sequence);
  return std::span<const PackedPiece>(pieces_).subspan(static_cast<size_t>(starts_[s]),
                                                       static_cast<size_t>(starts_[s + 1] - starts_[s]));
}

int64_t DocumentPacking::targets(int64_t sequence) const {
  int64_t n = 0;
  for (const PackedPiece& p : pieces(sequence)) n += p.targets();
  return n;
}

}  // namespace pipetrain
