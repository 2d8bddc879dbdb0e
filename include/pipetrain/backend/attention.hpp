// How the CPU's causal attention (src/backend/cpu/attention.cpp) blocks its queries and
// what it keeps for backward. Queries go in blocks of kAttnBlock rows; block [i0, i1) meets
// keys [0, i1) only, and its probabilities are kept as a dense (i1 - i0) x i1 array, the
// blocks of one (sequence, head) one after another. The upper triangle beyond each block is
// neither computed nor kept: 5/8 of T x T at T = 256, about half at long T.
#pragma once
#include <cstdint>

namespace pipetrain {

inline constexpr int kAttnBlock = 64;

// Where the block of queries starting at i0 (a multiple of kAttnBlock) begins: the blocks
// before it hold kAttnBlock rows of kAttnBlock, 2 kAttnBlock, ... keys.
constexpr int64_t causal_block_offset(int64_t i0) {
  const int64_t k = i0 / kAttnBlock;
  return int64_t{kAttnBlock} * kAttnBlock * k * (k + 1) / 2;
}

// Elements kept per (sequence, head) for T tokens.
constexpr int64_t causal_block_elements(int64_t T) {
  if (T <= 0) return 0;
  const int64_t last = (T - 1) / kAttnBlock * kAttnBlock;
  return causal_block_offset(last) + (T - last) * T;
}

}  // namespace pipetrain
