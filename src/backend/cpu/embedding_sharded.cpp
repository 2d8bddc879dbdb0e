// Vocabulary-sharded token embedding and the separate position embedding
// (tensor parallelism: each rank holds rows [row_begin, row_end) of the padded
// token table; tokens outside them contribute zero and are summed in by the
// all-reduce). Lookup and position_add read an f32 table, or a bf16 one (a bf16 run
// keeps no f32 copy of its tables), and are parallel over tokens. The two
// backward kernels scatter-add into shared rows (repeated tokens, every batch
// row into the same position), so their work items own disjoint column blocks
// and each walks its rows in token order, like embedding_backward: race-free
// under any host execution space, deterministic, and summed in the same order
// as embedding_backward (a sharded model reproduces it bit for bit).
#include "cpu_kernels.hpp"
#include "pipetrain/core/error.hpp"

namespace pipetrain::cpu {
namespace {

void check_shape(const char* kernel, int64_t rows, int C) {
  if (rows < 0 || C < 0) fail("{}: negative size (rows={}, C={})", kernel, rows, C);
}

void check_range(const char* kernel, int row_begin, int row_end) {
  if (row_begin < 0 || row_end < row_begin) {
    fail("{}: invalid row range [{}, {})", kernel, row_begin, row_end);
  }
}

KOKKOS_INLINE_FUNCTION float widen(float x) { return x; }
KOKKOS_INLINE_FUNCTION float widen(bf16 x) { return to_float(x); }

template <class W>
void lookup_rows(float* out, const int32_t* tokens, const W* wte, int row_begin, int row_end, int N, int C) {
  check_shape("embedding_lookup", N, C);
  check_range("embedding_lookup", row_begin, row_end);
  Kokkos::parallel_for("pipetrain::embedding_lookup", HostRange(0, N), [=](const int64_t n) {
    const int32_t tok = tokens[n];
    float* o = out + n * C;
    if (tok >= row_begin && tok < row_end) {
      const W* e = wte + static_cast<int64_t>(tok - row_begin) * C;
      for (int c = 0; c < C; ++c) o[c] = widen(e[c]);
    } else {
      for (int c = 0; c < C; ++c) o[c] = 0.0f;
    }
  });
}

}  // namespace

void embedding_lookup(float* out, const int32_t* tokens, const float* wte, int row_begin, int row_end, int N, int C) {
  lookup_rows(out, tokens, wte, row_begin, row_end, N, C);
}

void embedding_lookup(float* out, const int32_t* tokens, const bf16* wte, int row_begin, int row_end, int N, int C) {
  lookup_rows(out, tokens, wte, row_begin, row_end, N, C);
}

void embedding_scatter(float* dwte, const float* dout, const int32_t* tokens, int row_begin,
                       int row_end, int N, int C) {
  check_shape("embedding_scatter", N, C);
  check_range("embedding_scatter", row_begin, row_end);
  if (N == 0 || C == 0) return;
  const int64_t width = column_block_width(C);
  const int64_t blocks = (C + width - 1) / width;
  Kokkos::parallel_for("pipetrain::embedding_scatter", HostRange(0, blocks),
                       [=](const int64_t blk) {
                         const int64_t c0 = blk * width;
                         const int64_t c1 = c0 + width < C ? c0 + width : C;
                         for (int64_t n = 0; n < N; ++n) {
                           const int32_t tok = tokens[n];
                           if (tok < row_begin || tok >= row_end) continue;
                           const float* d = dout + n * C;
                           float* w = dwte + static_cast<int64_t>(tok - row_begin) * C;
                           for (int64_t c = c0; c < c1; ++c) w[c] += d[c];
                         }
                       });
}

namespace {

template <class W>
void add_positions(float* out, const W* wpe, int B, int T, int C, const int32_t* positions) {
  if (B < 0 || T < 0) fail("position_add: negative size (B={}, T={})", B, T);
  const int64_t N = static_cast<int64_t>(B) * T;
  check_shape("position_add", N, C);
  Kokkos::parallel_for("pipetrain::position_add", HostRange(0, N), [=](const int64_t n) {
    const W* p = wpe + (positions ? positions[n] : n % T) * C;
    float* o = out + n * C;
    for (int c = 0; c < C; ++c) o[c] += widen(p[c]);
  });
}

}  // namespace

void position_add(float* out, const float* wpe, int B, int T, int C, const int32_t* positions) {
  add_positions(out, wpe, B, T, C, positions);
}

void position_add(float* out, const bf16* wpe, int B, int T, int C, const int32_t* positions) {
  add_positions(out, wpe, B, T, C, positions);
}

void position_backward(float* dwpe, const float* dout, int B, int T, int C, const int32_t* positions) {
  if (B < 0 || T < 0) fail("position_backward: negative size (B={}, T={})", B, T);
  check_shape("position_backward", static_cast<int64_t>(B) * T, C);
  if (B == 0 || T == 0 || C == 0) return;
  if (positions) {  // packed documents: as embedding_scatter, every row in order into its position's row
    const int64_t N = static_cast<int64_t>(B) * T, width = column_block_width(C);
    const int64_t blocks = (C + width - 1) / width;
    Kokkos::parallel_for("pipetrain::position_backward_packed", HostRange(0, blocks), [=](const int64_t blk) {
      const int64_t c0 = blk * width, c1 = c0 + width < C ? c0 + width : C;
      for (int64_t n = 0; n < N; ++n) {
        const float* d = dout + n * C;
        float* p = dwpe + static_cast<int64_t>(positions[n]) * C;
        for (int64_t c = c0; c < c1; ++c) p[c] += d[c];
      }
    });
    return;
  }
  // Work item (t, column block) owns dwpe[t, block] and adds the B rows b*T + t
  // into it in order of b. Blocks are only split across threads when T alone
  // does not give every thread a row.
  const int64_t conc = HostSpace().concurrency();
  const int64_t width = T >= conc ? int64_t{C} : column_block_width(C);
  const int64_t blocks = (C + width - 1) / width;
  Kokkos::parallel_for("pipetrain::position_backward", HostRange(0, int64_t{T} * blocks),
                       [=](const int64_t item) {
                         const int64_t t = item / blocks;
                         const int64_t c0 = (item % blocks) * width;
                         const int64_t c1 = c0 + width < C ? c0 + width : C;
                         float* p = dwpe + t * C;
                         for (int64_t b = 0; b < B; ++b) {
                           const float* d = dout + (b * T + t) * C;
                           for (int64_t c = c0; c < c1; ++c) p[c] += d[c];
                         }
                       });
}

}  // namespace pipetrain::cpu
