// Packing whole documents into fixed-length sequences (data.pack_documents).
//
// The token stream is cut into documents by their boundaries. Documents are placed in
// stream order into sequences of seq_len positions, each whole document after the last
// one while it fits, else in a new sequence (next fit: deterministic, one pass, no
// reordering). A document of L tokens takes L positions and gives L - 1 targets (its last
// token predicts nothing: no target crosses a boundary). A document longer than a
// sequence is split into pieces of seq_len tokens, each packed as a document of its own
// whose last target is the next piece's first token; a piece with no target (one token)
// is dropped, as is a one-token document. Positions a sequence's documents leave free are
// padding: their targets are ignored.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace pipetrain {

// Stream tokens [first, first + length) as a sequence's inputs; each predicts the next
// stream token, the last one only where last_target (a piece of a split document).
struct PackedPiece {
  int64_t first = 0;
  int32_t length = 0;
  bool last_target = false;
  int64_t targets() const { return length - 1 + (last_target ? 1 : 0); }
};

class DocumentPacking {
 public:
  // boundaries: the stream positions where documents start, ascending, then the stream's
  // end (D + 1 values for D documents; empty documents are skipped).
  DocumentPacking(std::span<const int64_t> boundaries, int seq_len);

  int64_t num_sequences() const { return static_cast<int64_t>(starts_.size()) - 1; }
  std::span<const PackedPiece> pieces(int64_t sequence) const;
  // Targets that count in the sequence (the others are ignored).
  int64_t targets(int64_t sequence) const;
  int64_t documents() const { return documents_; }
  int64_t documents_split() const { return split_; }    // longer than seq_len tokens
  int64_t positions_filled() const { return filled_; }  // out of num_sequences() * seq_len

 private:
  void place(PackedPiece piece);
  int seq_len_;
  int fill_ = 0;                     // positions taken in the sequence being filled
  std::vector<PackedPiece> pieces_;  // every sequence's, one after another
  std::vector<int64_t> starts_{0};   // sequence s: pieces_[starts_[s], starts_[s + 1])
  int64_t documents_ = 0, split_ = 0, filled_ = 0;
};

}  // namespace pipetrain
