// Token + position embedding. Forward is parallel over tokens. Backward is a
// scatter-add into dwte (repeated tokens hit the same row), so its work items
// own disjoint column blocks and each walks every token in order: race-free
// under any host execution space, and deterministic.
#include "cpu_kernels.hpp"
#include "pipetrain/core/error.hpp"

namespace pipetrain::cpu {
namespace {

// The header gives no vocabulary size, so only negative ids can be rejected here.
void check_tokens(const int32_t* tokens, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0) fail("embedding: token {} at position {} is negative", tokens[i], i);
  }
}

}  // namespace

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int B, int T, int C) {
  const int64_t N = static_cast<int64_t>(B) * T;
  check_tokens(tokens, N);
  Kokkos::parallel_for("pipetrain::embedding_forward", HostRange(0, N), [=](const int64_t n) {
    const float* e = wte + static_cast<int64_t>(tokens[n]) * C;
    const float* p = wpe + (n % T) * C;
    float* o = out + n * C;
    for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
  });
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                        int T, int C) {
  const int64_t N = static_cast<int64_t>(B) * T;
  check_tokens(tokens, N);
  // One column block per thread of the host space (at least 64 columns, so each
  // row segment read is a few cache lines); Serial gets a single block.
  const int64_t conc = HostSpace().concurrency();
  int64_t width = (C + conc - 1) / (conc > 0 ? conc : 1);
  width = width < 64 ? 64 : (width + 15) / 16 * 16;
  const int64_t blocks = (C + width - 1) / width;
  Kokkos::parallel_for("pipetrain::embedding_backward", HostRange(0, blocks),
                       [=](const int64_t blk) {
                         const int64_t c0 = blk * width;
                         const int64_t c1 = c0 + width < C ? c0 + width : C;
                         for (int64_t n = 0; n < N; ++n) {
                           const float* d = dout + n * C;
                           float* w = dwte + static_cast<int64_t>(tokens[n]) * C;
                           float* p = dwpe + (n % T) * C;
                           for (int64_t c = c0; c < c1; ++c) {
                             w[c] += d[c];
                             p[c] += d[c];
                           }
                         }
                       });
}

}  // namespace pipetrain::cpu
