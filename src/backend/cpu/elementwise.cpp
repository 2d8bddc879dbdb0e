// Elementwise kernels and reductions on the host: fill, add, accumulate,
// scale, the bf16 casts, sum_squares, all_finite, bias_add, bias_backward.
#include <cstdint>
#include <cstring>
#if defined(__SSE__)
#include <immintrin.h>
#endif

#include "cpu_kernels.hpp"

namespace pipetrain::cpu {

namespace {

// Buffers beyond a core's L2 (a step's gradients: hundreds of MB) are filled with
// non-temporal stores: an ordinary store first reads each line it writes, so streaming
// halves the memory traffic (measured 2.4x faster zeroing of 0.5 GB, bench_kernels).
// Smaller buffers are about to be read, and stay in cache with ordinary stores.
constexpr size_t kStreamFillBytes = size_t{4} << 20;

void fill_range(float* x, float value, int64_t b, int64_t e, bool stream) {
#if defined(__SSE__)
  if (stream) {
    for (; b < e && reinterpret_cast<uintptr_t>(x + b) % 16 != 0; ++b) x[b] = value;
    const __m128 v = _mm_set1_ps(value);
    for (; b + 4 <= e; b += 4) _mm_stream_ps(x + b, v);
    _mm_sfence();  // this work item's streamed stores are visible before it ends
  }
#else
  (void)stream;
#endif
  for (int64_t i = b; i < e; ++i) x[i] = value;
}

}  // namespace

void fill(float* x, float value, size_t n) {
  const bool stream = n * sizeof(float) >= kStreamFillBytes;
  for_chunks("pipetrain::fill", n, [=](int64_t b, int64_t e) { fill_range(x, value, b, e, stream); });
}

void add(float* out, const float* a, const float* b, size_t n) {
  for_chunks("pipetrain::add", n, [=](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) out[i] = a[i] + b[i];
  });
}

void accumulate(float* out, const float* a, size_t n) {
  for_chunks("pipetrain::accumulate", n, [=](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] += a[i];
  });
}

void scale(float* x, float s, size_t n) {
  for_chunks("pipetrain::scale", n, [=](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) x[i] *= s;
  });
}

namespace {

PIPETRAIN_SIMD_CLONES
void cast_to_bf16_range(bf16* out, const float* in, int64_t b, int64_t e) {
  for (int64_t i = b; i < e; ++i) out[i] = to_bf16(in[i]);
}

PIPETRAIN_SIMD_CLONES
void round_to_bf16_range(bf16* out, float* x, int64_t b, int64_t e) {
  for (int64_t i = b; i < e; ++i) {
    out[i] = to_bf16(x[i]);
    x[i] = to_float(out[i]);
  }
}

}  // namespace

void cast_to_bf16(bf16* out, const float* in, size_t n) {
  for_chunks("pipetrain::cast_to_bf16", n, [=](int64_t b, int64_t e) { cast_to_bf16_range(out, in, b, e); });
}

void round_to_bf16(bf16* out, float* x, size_t n) {
  for_chunks("pipetrain::round_to_bf16", n, [=](int64_t b, int64_t e) { round_to_bf16_range(out, x, b, e); });
}

void cast_to_f32(float* out, const bf16* in, size_t n) {
  for_chunks("pipetrain::cast_to_f32", n, [=](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = to_float(in[i]);
  });
}

namespace {

// The sum of squares of x[0, n) in double, over kLanes fixed lanes (the same order, so
// the same bits, in every clone).
PIPETRAIN_SIMD_CLONES
double sum_squares_chunk(const float* x, int64_t n) {
  double lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const double v = x[i + j];
      lane[j] += v * v;
    }
  }
  double s = 0.0;
  for (; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  for (int j = 0; j < kLanes; ++j) s += lane[j];
  return s;
}

}  // namespace

double sum_squares(const float* x, size_t n) {
  const int64_t total = static_cast<int64_t>(n);
  const int64_t count = (total + kChunk - 1) / kChunk;
  double result = 0.0;
  Kokkos::parallel_reduce(
      "pipetrain::sum_squares", HostRange(0, count),
      [=](const int64_t ci, double& sum) {
        const int64_t b = ci * kChunk;
        sum += sum_squares_chunk(x + b, (b + kChunk < total ? b + kChunk : total) - b);
      },
      result);
  return result;
}

bool all_finite(const float* x, size_t n) {
  const int64_t total = static_cast<int64_t>(n);
  const int64_t count = (total + kChunk - 1) / kChunk;
  int64_t bad = 0;
  Kokkos::parallel_reduce(
      "pipetrain::all_finite", HostRange(0, count),
      [=](const int64_t ci, int64_t& nbad) {
        const int64_t b = ci * kChunk;
        const int64_t e = b + kChunk < total ? b + kChunk : total;
        // Inf and NaN are exactly the floats whose exponent bits are all ones.
        uint32_t any = 0;
        for (int64_t i = b; i < e; ++i) {
          uint32_t u;
          std::memcpy(&u, x + i, sizeof u);
          any |= static_cast<uint32_t>((u & 0x7f800000u) == 0x7f800000u);
        }
        nbad += any;
      },
      bad);
  return bad == 0;
}

void bias_add(float* out, const float* bias, int N, int C) {
  Kokkos::parallel_for("pipetrain::bias_add", HostRange(0, N), [=](const int64_t n) {
    float* o = out + n * C;
    for (int c = 0; c < C; ++c) o[c] += bias[c];
  });
}

void bias_backward(float* dbias, const float* dout, int N, int C) {
  // Each work item owns a block of columns and sweeps all rows (rows outer,
  // columns inner): race-free and streaming through dout.
  constexpr int kCols = 512;
  const int64_t blocks = (C + kCols - 1) / kCols;
  Kokkos::parallel_for("pipetrain::bias_backward", HostRange(0, blocks), [=](const int64_t blk) {
    const int c0 = static_cast<int>(blk) * kCols;
    const int w = C - c0 < kCols ? C - c0 : kCols;
    float acc[kCols];
    for (int c = 0; c < w; ++c) acc[c] = 0.0f;
    for (int n = 0; n < N; ++n) {
      const float* d = dout + static_cast<int64_t>(n) * C + c0;
      for (int c = 0; c < w; ++c) acc[c] += d[c];
    }
    for (int c = 0; c < w; ++c) dbias[c0 + c] += acc[c];
  });
}

}  // namespace pipetrain::cpu
