// Packed documents (data.pack_documents), as every layer and kernel reads them.
//
// A sequence of T tokens may hold several documents. positions[t] (int32, one per token)
// is token t's place in its document, so its document starts at t - positions[t]:
//   - position embeddings and rotary angles use positions[t] instead of t;
//   - causal attention lets query t see keys [t - positions[t], t] only (block-diagonal
//     causal: no token attends into a neighbouring document);
//   - a target of kIgnoredTarget (after a document's last token, on padding) has loss 0
//     and gradient 0, and the step's loss is averaged over the targets that count.
// Without packing the positions pointer is null and every position is t.
#pragma once
#include <cstdint>

namespace pipetrain {

inline constexpr int32_t kIgnoredTarget = -1;

// The first key query t may see.
constexpr int first_visible_key(const int32_t* positions, int64_t row, int t) {
  return positions ? t - positions[row] : 0;
}

}  // namespace pipetrain
