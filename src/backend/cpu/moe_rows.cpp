// Mixture-of-experts row movement (Backend::gather_rows, combine_rows, row_dots): a token's
// rows to and from its experts' contiguous rows. Parallel over output rows, each summed in
// a fixed order, so the result is the same under any host execution space.
#include "cpu_kernels.hpp"
#include "pipetrain/core/error.hpp"

namespace pipetrain::cpu {

void gather_rows(float* out, const float* in, const int32_t* index, const float* scale, int rows, int C) {
  if (rows < 0 || C < 0) fail("gather_rows: negative size (rows={}, C={})", rows, C);
  Kokkos::parallel_for("pipetrain::gather_rows", HostRange(0, rows), [=](const int64_t i) {
    const float* src = in + static_cast<int64_t>(index[i]) * C;
    const float s = scale ? scale[i] : 1.0f;
    float* o = out + i * C;
    for (int c = 0; c < C; ++c) o[c] = s * src[c];
  });
}

void combine_rows(float* out, const float* in, const int32_t* row, const float* weight, int N, int k, int C) {
  if (N < 0 || k < 0 || C < 0) fail("combine_rows: negative size (N={}, k={}, C={})", N, k, C);
  Kokkos::parallel_for("pipetrain::combine_rows", HostRange(0, N), [=](const int64_t t) {
    float* o = out + t * C;
    for (int j = 0; j < k; ++j) {
      const int32_t r = row[t * k + j];
      if (r < 0) continue;  // dropped over capacity
      const float w = weight ? weight[r] : 1.0f;
      const float* src = in + static_cast<int64_t>(r) * C;
      for (int c = 0; c < C; ++c) o[c] += w * src[c];
    }
  });
}

void row_dots(float* out, const float* a, const float* b, const int32_t* row, int N, int k, int C) {
  if (N < 0 || k < 0 || C < 0) fail("row_dots: negative size (N={}, k={}, C={})", N, k, C);
  Kokkos::parallel_for("pipetrain::row_dots", HostRange(0, static_cast<int64_t>(N) * k), [=](const int64_t tj) {
    const float* x = a + (tj / k) * C;
    double s = 0;  // a row dropped over capacity (< 0): 0
    if (row[tj] >= 0)
      for (int c = 0; c < C; ++c) s += static_cast<double>(x[c]) * b[static_cast<int64_t>(row[tj]) * C + c];
    out[tj] = static_cast<float>(s);
  });
}

}  // namespace pipetrain::cpu
