// The row kernels of the CPU's causal attention, shared by its f32 (attention.cpp) and
// bf16-product (attention_bf16.cpp) forms: softmax and its backward over one row of a
// query block, in f32.
#pragma once
#include "cpu_kernels.hpp"

namespace pipetrain::cpu {
namespace {

// Row softmax over row[first..len) in place (scores already scaled); zeroes the rest of
// the row's T (first > 0: a packed document's query, whose keys start there).
[[maybe_unused]] PIPETRAIN_SIMD_CLONES void causal_softmax_row(float* row, int first, int len, int T) {
  for (int k = 0; k < first; ++k) row[k] = 0.0f;
  row += first;
  len -= first;
  T -= first;
  const float m = row_max(row, len);

  float sums[kLanes] = {};
  int c = 0;
  for (; c + kLanes <= len; c += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const float e = fast_expf(row[c + j] - m);
      row[c + j] = e;
      sums[j] += e;
    }
  }
  float sum = 0.0f;
  for (; c < len; ++c) {
    const float e = fast_expf(row[c] - m);
    row[c] = e;
    sum += e;
  }
  for (int j = 0; j < kLanes; ++j) sum += sums[j];
  const float inv = 1.0f / sum;
  for (int k = 0; k < len; ++k) row[k] *= inv;
  for (int k = len; k < T; ++k) row[k] = 0.0f;
}

// Softmax backward for one row: ds[j] = scale * p[j] * (dp[j] - sum_k p[k] dp[k])
// for j < len, written over dp; ds[len..nk) = 0.
[[maybe_unused]] PIPETRAIN_SIMD_CLONES
void causal_softmax_backward_row(float* dp, const float* p, int len, int nk, float scale) {
  float acc[kLanes] = {};
  int c = 0;
  for (; c + kLanes <= len; c += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] += p[c + j] * dp[c + j];
  }
  float dot = 0.0f;
  for (; c < len; ++c) dot += p[c] * dp[c];
  for (int j = 0; j < kLanes; ++j) dot += acc[j];
  for (int k = 0; k < len; ++k) dp[k] = scale * p[k] * (dp[k] - dot);
  for (int k = len; k < nk; ++k) dp[k] = 0.0f;
}

}  // namespace
}  // namespace pipetrain::cpu
