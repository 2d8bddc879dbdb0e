// Private header of the CPU backend: the free kernel functions that CpuBackend
// forwards to, plus small helpers shared by the kernel files (the host range
// policy, chunking, SIMD clones, lane accumulators, branch-free max/exp/sqrt
// that g++ -O3 vectorises). Semantics of every kernel are those documented in
// include/pipetrain/backend/backend.hpp.
#pragma once
#include <Kokkos_Core.hpp>
#include <bit>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>
#include <utility>
#include <cstdint>

#include "pipetrain/backend/attention.hpp"
#include "pipetrain/backend/backend.hpp"
#include "pipetrain/backend/bf16_products.hpp"
#include "pipetrain/core/dtype.hpp"

namespace pipetrain::cpu {

// Every non-gemm kernel runs on the default host execution space (Serial on
// Debian, OpenMP at some sites): work items must write disjoint memory.
using HostSpace = Kokkos::DefaultHostExecutionSpace;
using HostRange = Kokkos::RangePolicy<HostSpace, Kokkos::IndexType<int64_t>>;

// Hot row/chunk functions are compiled three times on x86-64 Linux with g++: an
// AVX-512 clone (512-bit vectors), an AVX2 one and a baseline (SSE2) one, picked at
// load time (ifunc). Same IEEE operations in all (these files are built with
// -ffp-contract=off, src/CMakeLists.txt), only wider vectors: the same bits on every
// x86-64 CPU. (AVX-512: GELU 1.5-2x, the cross-entropy pass 1.3x faster than AVX2.)
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define PIPETRAIN_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define PIPETRAIN_SIMD_CLONES
#endif

// Elementwise kernels process this many elements per work item (inner loop
// vectorised by the compiler).
inline constexpr int64_t kChunk = 8192;
// Reductions use this many independent accumulators ("lanes") so that g++ can
// vectorise them without -ffast-math (no reassociation needed). 32, not 8 or
// 16: with those g++ 12 emits permute-heavy code that is 3-4x slower.
inline constexpr int kLanes = 32;

// Runs f(begin, end) over [0, n) cut into chunks of kChunk elements, one work
// item per chunk (chunks are disjoint, so f may write its range freely).
template <class F>
void for_chunks(const char* label, size_t n, const F& f) {
  const int64_t count = static_cast<int64_t>((n + kChunk - 1) / kChunk);
  const int64_t total = static_cast<int64_t>(n);
  Kokkos::parallel_for(label, HostRange(0, count), [=](const int64_t ci) {
    const int64_t begin = ci * kChunk;
    const int64_t end = begin + kChunk < total ? begin + kChunk : total;
    f(begin, end);
  });
}

// Orders floats as int32 (monotonic: a < b  <=>  key(a) < key(b) for non-NaN).
constexpr int32_t float_order_key(float f) {
  const int32_t b = std::bit_cast<int32_t>(f);
  return b ^ ((b >> 31) & 0x7fffffff);
}
constexpr float float_from_order_key(int32_t k) {
  return std::bit_cast<float>(k ^ ((k >> 31) & 0x7fffffff));
}

// max(x[0..n)), n >= 1, as an integer max over order keys (vectorises; a float
// max reduction does not without -ffast-math). A positive NaN wins.
inline float row_max(const float* x, int64_t n) {
  int32_t m = float_order_key(x[0]);
  for (int64_t i = 1; i < n; ++i) {
    const int32_t k = float_order_key(x[i]);
    m = k > m ? k : m;
  }
  return float_from_order_key(m);
}

// exp(x) for float, written without library calls or branches so that loops
// calling it vectorise (g++ -O3, no -ffast-math). Cephes polynomial with
// Cody-Waite range reduction, max relative error ~1e-7 on [-87, 88].
// Inputs are clamped to [-87, 88] (in the integer domain: a float clamp gets
// turned into branches by g++): exp(< -87) returns ~1.6e-38 instead of 0
// (harmless as a softmax weight), exp(> 88) returns ~1.65e38. NaN propagates.
inline float fast_expf(float x_in) {
  constexpr int32_t lo = float_order_key(-87.0f);
  constexpr int32_t hi = float_order_key(88.0f);
  int32_t key = float_order_key(x_in);
  key = key < lo ? lo : key;
  key = key > hi ? hi : key;
  const float x = float_from_order_key(key);
  // n = round(x * log2(e)) with the 1.5 * 2^23 trick (exact under IEEE rounding).
  const float magic = 12582912.0f;
  const float t = x * 1.44269504088896341f + magic;
  const float n = t - magic;
  const int32_t ni = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(magic);
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * (r * r) + r + 1.0f;
  const float res = y * std::bit_cast<float>(static_cast<int32_t>((ni + 127) << 23));
  // NaN in, NaN out (an integer mask keeps the loop branch-free).
  const uint32_t abits = std::bit_cast<uint32_t>(x_in) & 0x7fffffffu;
  const uint32_t nan_mask = 0u - static_cast<uint32_t>(abits > 0x7f800000u);
  return std::bit_cast<float>(std::bit_cast<uint32_t>(res) | nan_mask);
}

// Width of the column blocks that scatter-add kernels hand out as work items:
// about one block per thread of the host space, at least 64 columns (a row
// segment is a few cache lines) and a multiple of 16; Serial gets one block.
// Each work item owns its columns of every output row, so rows hit repeatedly
// (repeated tokens) never race and are summed in a fixed order.
inline int64_t column_block_width(int64_t C) {
  const int64_t conc = HostSpace().concurrency();
  int64_t width = (C + conc - 1) / (conc > 0 ? conc : 1);
  return width < 64 ? 64 : (width + 15) / 16 * 16;
}

// ---- memory ----
void fill(float* x, float value, size_t n);

// ---- matrix products (CBLAS sgemm, row-major) ----
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc);
// The same product through oneDNN's sgemm (gemm_onednn.cpp); false when oneDNN is not built in.
bool gemm_onednn(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
                 int ldb, float beta, float* C, int ldc);
// gemm in `library` (core/dense_products.hpp): oneDNN where asked for and built in, else the BLAS.
void gemm_in(ProductLibrary library, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
             int lda, const float* B, int ldb, float beta, float* C, int ldc);
// The products of one dense weight shape at `rows` rows on each path this build has
// (dense_timing.cpp): the BLAS, oneDNN's sgemm and oneDNN by a packed weight, and the
// reorder that packs it.
DenseProductTimes time_dense_products(DenseShape shape, int rows);
// Starts C (M x N, leading dimension ldc; the residual's too) at bias + residual, for a
// product accumulated into it (either may be null, not both).
void start_rows(float* C, int M, int N, int ldc, const float* bias, const float* residual);
// C = op(A) op(B) + bias + residual, as Backend::gemm_bias states it.
void gemm_bias(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
               float* C, int ldc, const float* bias, const float* residual,
               ProductLibrary library = ProductLibrary::Blas);
// bf16 operands through oneDNN (path kOnednn, where it has the shape), else widened into
// `scratch` (reused between calls) and gemm; the epilogue as Backend::gemm_bf16 states it.
void gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const bf16* A, int lda, const bf16* B,
               int ldb, float beta, float* C, int ldc, Backend::Epilogue epilogue, const float* bias, float* pre_gelu,
               std::vector<float>& scratch, Bf16Products path);
// The same product through oneDNN's matmul (gemm_bf16_onednn.cpp), the bias (if any) as
// its own bias, written straight into C; false when oneDNN is not built in or has no
// implementation for the shape better than its reference one (the caller widens then).
bool gemm_bf16_onednn(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const bf16* A, int lda,
                      const bf16* B, int ldb, float beta, float* C, int ldc, const float* bias);
bool onednn_built_in();
long onednn_products_run();
bool onednn_runs_bf16();    // built in, and its matmul runs bf16 here (natively or emulated)
bool onednn_native_bf16();  // its effective ISA has bf16 instructions (AVX512_BF16, AMX)
std::string onednn_description();  // "oneDNN 2.6.3 (avx512_core_amx)"
void onednn_set_threads(int n);
// A dense layer's forward and input-gradient products by weights kept in oneDNN's own
// layout while they are held (dense_packed.cpp; Backend::dense_forward states the
// contract). Each call returns false where it did not run the product (not held, or no
// optimized implementation for the shape): the caller runs sgemm.
class PackedDense {
 public:
  // nullptr where this build or CPU cannot (no oneDNN, or only its reference matmul).
  static std::unique_ptr<PackedDense> make();
  ~PackedDense();
  void hold(bool held);
  bool forward(int rows, int out, int in, const float* x, const float* w, float* y, const float* bias,
               const float* residual);
  bool backward_input(int rows, int out, int in, const float* dy, const float* w, float* dx);
  // Packs only weights of these shapes (the others' products return false); empty: all.
  void only(std::vector<DenseShape> shapes);
  // The copies kept now: elements (one count per copy) and bytes in oneDNN's layout.
  std::pair<int64_t, size_t> held_copies() const;
  // Backend::refresh_packed_weights_until and forget_packed_weights.
  int refresh_until(const std::function<bool()>& arrived);
  void forget();

 private:
  PackedDense();
  class Impl;
  std::unique_ptr<Impl> impl_;
};
void gemm_strided_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                          const float* A, int lda, long stride_a, const float* B, int ldb,
                          long stride_b, float beta, float* C, int ldc, long stride_c, int batch);

// ---- elementwise and reductions ----
void add(float* out, const float* a, const float* b, size_t n);
void accumulate(float* out, const float* a, size_t n);
void scale(float* x, float s, size_t n);
void cast_to_bf16(bf16* out, const float* in, size_t n);
void round_to_bf16(bf16* out, float* x, size_t n);  // out = bf16(x), x = f32(out), one pass
void cast_to_f32(float* out, const bf16* in, size_t n);
double sum_squares(const float* x, size_t n);
bool all_finite(const float* x, size_t n);
void bias_add(float* out, const float* bias, int N, int C);
void bias_backward(float* dbias, const float* dout, int N, int C);

// ---- GELU ----
void gelu_forward(float* out, const float* inp, size_t n);
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n);

// ---- LayerNorm ----
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C, float eps);
void layernorm_backward_input(float* dinp, const float* dout, const float* inp,
                              const float* weight, const float* mean, const float* rstd, int N,
                              int C);
void layernorm_backward_weight(float* dweight, float* dbias, const float* dout, const float* inp,
                               const float* mean, const float* rstd, int N, int C);

// ---- attention ----
// Queries in blocks of kAttnBlock rows, probabilities kept block by block
// (pipetrain/backend/attention.hpp): att and scratch hold causal_block_elements(T) per
// (sequence, head).
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH, int NKV,
                       const int32_t* positions = nullptr);
void attention_decode(float* out, const float* q, int ldq, const float* k, const float* v, int ldkv, int n, int pos,
                      int NH, int NKV, int hs);
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att, int B,
                        int T, int C, int NH, int NKV);
// The same with bf16 products where the CPU has them (attention_bf16.cpp): att is the bf16
// stash (B, NH, causal_block_elements(T)) forward writes and backward reads. Workspace, per
// call: heads bf16 and grad_heads f32 of T (C + 2 NKV hs) each, dout_heads bf16 and
// out_heads f32 of T C, scores / dp f32 and ds bf16 of kAttnBlock T; `widened`: gemm_bf16's.
// qkv in f32 (holding bf16 values: a bf16 run's rounded activations) or as stored, in bf16.
template <class Q>
void attention_forward_bf16(float* out, bf16* att, const Q* qkv, bf16* heads, float* scores, float* out_heads, int B,
                            int T, int C, int NH, int NKV, std::vector<float>& widened,
                            const int32_t* positions = nullptr);
template <class Q>
void attention_backward_bf16(float* dqkv, const float* dout, const Q* qkv, const bf16* att, bf16* heads,
                             bf16* dout_heads, float* grad_heads, float* dp, bf16* ds, int B, int T, int C, int NH,
                             int NKV, std::vector<float>& widened);

// ---- attention of one block of keys with global positions (attention_block.cpp) ----
// scores: kAttnBlock x Tk floats of workspace (one block of queries at a time); p, ds: the
// same each. lse and delta: (B, NH, Tq).
void attention_block_forward(float* out, float* lse, const float* q, int ldq, const float* k, const float* v, int ldkv,
                             const int32_t* qpos, const int32_t* qstart, const int32_t* kpos, int B, int Tq, int Tk,
                             int NH, int NKV, int hs, float* scores);
void attention_block_backward(float* dq, int lddq, float* dk, float* dv, int lddkv, const float* dout,
                              const float* delta, const float* lse, const float* q, int ldq, const float* k,
                              const float* v, int ldkv, const int32_t* qpos, const int32_t* qstart, const int32_t* kpos,
                              int B, int Tq, int Tk, int NH, int NKV, int hs, float* p, float* ds);
void attention_merge(float* out, float* lse, const float* block_out, const float* block_lse, int B, int T, int NH,
                     int hs);
void attention_delta(float* delta, const float* dout, const float* out, int B, int T, int NH, int hs);

// ---- mixture-of-experts rows (moe_rows.cpp) ----
void gather_rows(float* out, const float* in, const int32_t* index, const float* scale, int rows, int C);
void combine_rows(float* out, const float* in, const int32_t* row, const float* weight, int N, int k, int C);
void row_dots(float* out, const float* a, const float* b, const int32_t* row, int N, int k, int C);

// ---- Llama (rmsnorm.cpp, rope.cpp, swiglu.cpp) ----
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps);
void rmsnorm_backward_input(float* dinp, const float* dout, const float* inp, const float* weight,
                            const float* rstd, int N, int C);
void rmsnorm_backward_weight(float* dweight, const float* dout, const float* inp, const float* rstd, int N, int C);
void rope(float* x, int B, int T, int ld, int heads, int head_size, float theta, bool inverse, int pos0 = 0,
          const int32_t* positions = nullptr);
void swiglu_forward(float* out, const float* g, const float* u, size_t n);
void swiglu_backward(float* dg, float* du, const float* dout, const float* g, const float* u, size_t n);

// ---- embedding ----
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int B, int T, int C);
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                        int T, int C);

// ---- vocabulary-sharded embedding (embedding_sharded.cpp) ----
void embedding_lookup(float* out, const int32_t* tokens, const float* wte, int row_begin,
                      int row_end, int N, int C);
void embedding_lookup(float* out, const int32_t* tokens, const bf16* wte, int row_begin,
                      int row_end, int N, int C);
void embedding_scatter(float* dwte, const float* dout, const int32_t* tokens, int row_begin,
                       int row_end, int N, int C);
void position_add(float* out, const float* wpe, int B, int T, int C, const int32_t* positions = nullptr);
void position_add(float* out, const bf16* wpe, int B, int T, int C, const int32_t* positions = nullptr);
void position_backward(float* dwpe, const float* dout, int B, int T, int C, const int32_t* positions = nullptr);

// ---- cross-entropy ----
void crossentropy_forward(float* losses, float* logits, const int32_t* targets, int N, int V,
                          int Vp, float grad_scale);

// ---- vocabulary-parallel cross-entropy (crossentropy_parallel.cpp) ----
void crossentropy_local_max(float* rowmax, const float* logits, int N, int Vl, int col_begin,
                            int V);
void crossentropy_local_sums(float* sumexp, float* target_logit, const float* logits,
                             const float* rowmax, const int32_t* targets, int N, int Vl,
                             int col_begin, int V);
void crossentropy_finish(float* losses, float* logits, const float* rowmax, const float* sumexp,
                         const float* target_logit, const int32_t* targets, int N, int Vl,
                         int col_begin, int V, float grad_scale);

// ---- optimizer ----
void adamw(float* params, const float* grads, float* m, float* v, size_t n, float lr, float beta1,
           float beta2, float eps, float weight_decay, int step, float grad_scale);

}  // namespace pipetrain::cpu
