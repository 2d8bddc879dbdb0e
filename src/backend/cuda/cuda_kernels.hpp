// Private header of the CUDA backend: the launchers CudaBackend (cuda_backend.cpp)
// forwards to, one file per kernel family (*.cu; gemm.cpp for cuBLAS), and the
// error-check macros. Semantics of every kernel are those documented in
// include/pipetrain/backend/backend.hpp; argument checks that throw pipetrain::Error
// happen in cuda_backend.cpp before a launcher runs (the .cu files do not include
// fmt). Launchers queue work on ctx.stream and return without waiting, except where
// a result comes back to the host (sum_squares, all_finite, first_out_of_range).
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cublas_loader.hpp"
#include "pipetrain/backend/gemm_problem.hpp"
#include "pipetrain/backend/moe_routing.hpp"

namespace pipetrain::cuda {

// Bytes of Ctx::scratch: device memory owned by the backend for the small results
// of reductions and checks (used by one launcher at a time, in stream order).
inline constexpr size_t kScratchBytes = 64 * 1024;
// Bytes of Ctx::lt_workspace, the cuBLASLt matmul workspace (32 MiB: what its
// heuristics ask for on Hopper for large bf16 products).
inline constexpr size_t kLtWorkspaceBytes = 32u << 20;

// Everything a launcher needs: the backend's stream, its cuBLAS handle (bound to
// that stream) and scratch; max_blocks caps grid-stride launches (SMs x 8).
struct Ctx {
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;  // bf16 products (gemm_bf16.cpp)
  void* lt_workspace = nullptr;
  void* scratch = nullptr;
  unsigned max_blocks = 1024;
};

// Throw pipetrain::Error naming the call and the CUDA / cuBLAS error (cuda_backend.cpp).
[[noreturn]] void cuda_fail(const char* call, cudaError_t err);
[[noreturn]] void cublas_fail(const char* call, cublasStatus_t status);

#define PIPETRAIN_CUDA_CHECK(call)                                          \
  do {                                                                      \
    const cudaError_t pipetrain_err_ = (call);                              \
    if (pipetrain_err_ != cudaSuccess) {                                    \
      ::pipetrain::cuda::cuda_fail(#call, pipetrain_err_);                  \
    }                                                                       \
  } while (0)
#define PIPETRAIN_CUBLAS_CHECK(call)                                        \
  do {                                                                      \
    const cublasStatus_t pipetrain_st_ = (call);                            \
    if (pipetrain_st_ != CUBLAS_STATUS_SUCCESS) {                           \
      ::pipetrain::cuda::cublas_fail(#call, pipetrain_st_);                 \
    }                                                                       \
  } while (0)

// After a <<<...>>> launch: a bad configuration shows up here (errors inside the
// kernel surface at the next synchronising call).
inline void check_launch(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) cuda_fail(kernel, err);
}

// Grid size for a grid-stride loop over n items with `threads` per block.
inline unsigned grid_for(size_t n, unsigned threads, const Ctx& ctx) {
  const size_t blocks = (n + threads - 1) / threads;
  return blocks < ctx.max_blocks ? static_cast<unsigned>(blocks < 1 ? 1 : blocks)
                                 : ctx.max_blocks;
}

// Threads per block for kernels that give one block to a row of `len` elements.
inline unsigned row_threads(int64_t len) { return len >= 4096 ? 512 : len >= 1024 ? 256 : 128; }

// ---- memory and checks (elementwise.cu, checks.cu) ----
void fill(const Ctx& ctx, float* x, float value, size_t n);
// C[i, j] = beta * C[i, j] (0 when beta == 0) for an M x N matrix with row stride ldc.
void scale_matrix(const Ctx& ctx, float* C, int M, int N, int ldc, float beta);
// Deferred: records into *record the first v[i] outside [lo, hi) as (i << 32 | (uint32) v[i])
// (atomicMin: the lowest index wins; all bits set when none; n < 2^32). No wait.
void record_out_of_range(const Ctx& ctx, unsigned long long* record, const int32_t* v, int64_t n, int64_t lo,
                         int64_t hi);
// Index of the first v[i] outside [lo, hi), and that value in *value; -1 if none.
// Waits for the stream.
int64_t first_out_of_range(const Ctx& ctx, const int32_t* v, int64_t n, int64_t lo, int64_t hi,
                           int32_t* value);

// ---- matrix products (gemm.cpp: cuBLAS, row-major through the operand swap) ----
// Every problem in one cuBLAS grouped call (Backend::gemm_grouped).
void gemm_grouped(const Ctx& ctx, bool trans_a, bool trans_b, float alpha, float beta,
                  const std::vector<GemmProblem>& problems);
void gemm(const Ctx& ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
          const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc);
// bf16 A and B, f32 accumulation and C, epilogue 0 none, 1 bias, 2 bias + GELU (aux
// pre_gelu): Backend::gemm_bf16 (gemm_bf16.cpp: cuBLASLt).
void gemm_bf16(const Ctx& ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const __nv_bfloat16* A,
               int lda, const __nv_bfloat16* B, int ldb, float beta, float* C, int ldc, int epilogue,
               const float* bias, float* pre_gelu);
void gemm_strided_batched(const Ctx& ctx, bool trans_a, bool trans_b, int M, int N, int K,
                          float alpha, const float* A, int lda, long stride_a, const float* B,
                          int ldb, long stride_b, float beta, float* C, int ldc, long stride_c,
                          int batch);

// ---- elementwise and reductions (elementwise.cu) ----
void add(const Ctx& ctx, float* out, const float* a, const float* b, size_t n);
void accumulate(const Ctx& ctx, float* out, const float* a, size_t n);
void scale(const Ctx& ctx, float* x, float s, size_t n);
// bf16 as its 16 bits (pipetrain::bf16 on the host side); round to nearest even.
void cast_to_bf16(const Ctx& ctx, uint16_t* out, const float* in, size_t n);
void cast_to_f32(const Ctx& ctx, float* out, const uint16_t* in, size_t n);
double sum_squares(const Ctx& ctx, const float* x, size_t n);  // waits for the stream
bool all_finite(const Ctx& ctx, const float* x, size_t n);     // waits for the stream
void bias_add(const Ctx& ctx, float* out, const float* bias, int N, int C);
void bias_backward(const Ctx& ctx, float* dbias, const float* dout, int N, int C);

// ---- GELU (gelu.cu) ----
void gelu_forward(const Ctx& ctx, float* out, const float* inp, size_t n);
// A product's epilogue by kernel, in place on C (M x N, leading dimension ldc): adds
// bias[n] to every row (when bias), then, when pre_gelu, keeps that in pre_gelu (same
// layout) and stores gelu of it.
void matrix_epilogue(const Ctx& ctx, float* C, int M, int N, int ldc, const float* bias, float* pre_gelu);
void gelu_backward(const Ctx& ctx, float* dinp, const float* inp, const float* dout, size_t n);

// ---- LayerNorm (layernorm.cu) ----
void layernorm_forward(const Ctx& ctx, float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int N, int C, float eps);
void layernorm_backward_input(const Ctx& ctx, float* dinp, const float* dout, const float* inp,
                              const float* weight, const float* mean, const float* rstd, int N,
                              int C);
void layernorm_backward_weight(const Ctx& ctx, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* mean, const float* rstd, int N,
                               int C);

// ---- attention (attention.cu: gemm for the products, kernels for the softmax) ----
// positions (B*T on the device, or null): packed documents, as Backend states them; the
// probabilities before a query's first key are kept as 0, so backward needs no positions.
void attention_forward(const Ctx& ctx, float* out, float* att, const float* qkv, int B, int T, int C, int NH,
                       const int32_t* positions);
void attention_backward(const Ctx& ctx, float* dqkv, float* scratch, const float* dout,
                        const float* qkv, const float* att, int B, int T, int C, int NH);

// ---- flash attention (flash_attention.cu: O(T) per row, head size <= kMaxFlashHead,
// grouped-query: NKV key/value heads, qkv rows of C + 2 NKV hs) ----
inline constexpr int kMaxFlashHead = 128;
// positions (B*T on the device, or null): packed documents, as Backend states them; both
// passes take the forward's.
// out (B, T, C) and lse (B, NH, T): each row's log-sum-exp of its scaled scores.
void flash_attention_forward(const Ctx& ctx, float* out, float* lse, const float* qkv, int B, int T, int C, int NH,
                             int NKV, const int32_t* positions);
// dqkv (overwritten) from the forward's out and lse; delta: B * NH * T floats of workspace.
void flash_attention_backward(const Ctx& ctx, float* dqkv, float* delta, const float* dout, const float* qkv,
                              const float* out, const float* lse, int B, int T, int C, int NH, int NKV,
                              const int32_t* positions);

// ---- attention against one block of keys by global positions (attention_block.cu: context
// parallelism's ring, as Backend states it; flash style, head size <= kMaxBlockHead,
// grouped-query; positions int32 on the device, qstart null for 0) ----
inline constexpr int kMaxBlockHead = 256;
// out (B Tq rows of NH hs) and lse (B, NH, Tq); Tk = 0 gives 0 rows and lse -inf.
void attention_block_forward(const Ctx& ctx, float* out, float* lse, const float* q, int ldq, const float* k,
                             const float* v, int ldkv, const int32_t* qpos, const int32_t* qstart, const int32_t* kpos,
                             int B, int Tq, int Tk, int NH, int NKV, int hs);
void attention_merge(const Ctx& ctx, float* out, float* lse, const float* block_out, const float* block_lse, int B,
                     int T, int NH, int hs);
void attention_delta(const Ctx& ctx, float* delta, const float* dout, const float* out, int B, int T, int NH, int hs);
// Adds to dq, dk and dv (deterministic: every row summed by one warp in a fixed order).
void attention_block_backward(const Ctx& ctx, float* dq, int lddq, float* dk, float* dv, int lddkv, const float* dout,
                              const float* delta, const float* lse, const float* q, int ldq, const float* k,
                              const float* v, int ldkv, const int32_t* qpos, const int32_t* qstart, const int32_t* kpos,
                              int B, int Tq, int Tk, int NH, int NKV, int hs);

// ---- Llama (llama.cu): RMSNorm, rotary embeddings, SwiGLU, as Backend states them ----
void rmsnorm_forward(const Ctx& ctx, float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                     float eps);
void rmsnorm_backward_input(const Ctx& ctx, float* dinp, const float* dout, const float* inp, const float* weight,
                            const float* rstd, int N, int C);
void rmsnorm_backward_weight(const Ctx& ctx, float* dweight, const float* dout, const float* inp, const float* rstd,
                             int N, int C);
// The scores of pos + n keys live in shared memory: at most attention_decode_max_keys().
void attention_decode(const Ctx& ctx, float* out, const float* q, int ldq, const float* k, const float* v, int ldkv,
                      int n, int pos, int NH, int NKV, int hs);
// The device's opt-in shared memory per block, less the decode kernel's static shared
// memory (its reductions'), in floats.
int attention_decode_max_keys();
void rope(const Ctx& ctx, float* x, int B, int T, int ld, int heads, int head_size, float theta, bool inverse, int pos0,
          const int32_t* positions);
// moe_rows.cu
void gather_rows(const Ctx& ctx, float* out, const float* in, const int32_t* index, const float* scale, int rows,
                 int C);
void combine_rows(const Ctx& ctx, float* out, const float* in, const int32_t* row, const float* weight, int N, int k,
                  int C);
void row_dots(const Ctx& ctx, float* out, const float* a, const float* b, const int32_t* row, int N, int k, int C);
// Routing (moe_routing.cu): `scratch` holds moe_route_scratch_bytes(N, E, k) on the device;
// cap: each expert's most rows (INT_MAX: no capacity). Waits for the counts and losses.
size_t moe_route_scratch_bytes(int N, int E, int k);
RouteCounts moe_route(const Ctx& ctx, const RoutedArrays& out, const float* logits, const float* bias, int N,
                      const RouterSpec& spec, int cap, void* scratch);
void moe_router_backward(const Ctx& ctx, float* dlogits, const RoutedArrays& r, const float* logits,
                         const float* dweight, int N, const RouterSpec& spec, double scale);
void swiglu_forward(const Ctx& ctx, float* out, const float* g, const float* u, size_t n);
void swiglu_backward(const Ctx& ctx, float* dg, float* du, const float* dout, const float* g, const float* u,
                     size_t n);

// ---- embedding (embedding.cu) ----
void embedding_forward(const Ctx& ctx, float* out, const int32_t* tokens, const float* wte,
                       const float* wpe, int B, int T, int C);
// dwte[tokens[n] - row_begin, :] += dout[n, :] for tokens in [row_begin, row_end),
// deterministic (every (row, column) summed by one thread in token order).
void embedding_scatter(const Ctx& ctx, float* dwte, const float* dout, const int32_t* tokens,
                       int row_begin, int row_end, int N, int C);
void embedding_lookup(const Ctx& ctx, float* out, const int32_t* tokens, const float* wte,
                      int row_begin, int row_end, int N, int C);
void embedding_lookup(const Ctx& ctx, float* out, const int32_t* tokens, const uint16_t* wte,
                      int row_begin, int row_end, int N, int C);
// positions (B*T on the device, or null: row b*T + t is at t), as Backend states them.
void position_add(const Ctx& ctx, float* out, const float* wpe, int B, int T, int C, const int32_t* positions);
void position_add(const Ctx& ctx, float* out, const uint16_t* wpe, int B, int T, int C, const int32_t* positions);
// With positions: embedding_scatter into the rows 0 .. T-1 (deterministic, rows in order).
void position_backward(const Ctx& ctx, float* dwpe, const float* dout, int B, int T, int C, const int32_t* positions);

// ---- cross-entropy (crossentropy.cu, crossentropy_parallel.cu); targets checked ----
// A target of kIgnoredTarget (core/documents.hpp) has loss 0 and, with a gradient, a 0 row.
void crossentropy_forward(const Ctx& ctx, float* losses, float* logits, const int32_t* targets,
                          int N, int V, int Vp, float grad_scale);
// nreal: how many of the shard's Vl columns are real (global index < V).
void crossentropy_local_max(const Ctx& ctx, float* rowmax, const float* logits, int N, int Vl,
                            int nreal);
void crossentropy_local_sums(const Ctx& ctx, float* sumexp, float* target_logit,
                             const float* logits, const float* rowmax, const int32_t* targets,
                             int N, int Vl, int col_begin, int nreal);
void crossentropy_finish(const Ctx& ctx, float* losses, float* logits, const float* rowmax,
                         const float* sumexp, const float* target_logit, const int32_t* targets,
                         int N, int Vl, int col_begin, int nreal, float grad_scale);

// ---- optimizer (adamw.cu); inv_c1/inv_c2 = 1 / (1 - beta^step), from the host ----
void adamw(const Ctx& ctx, float* params, const float* grads, float* m, float* v, size_t n,
           float lr, float beta1, float beta2, float eps, float weight_decay, float inv_c1,
           float inv_c2, float grad_scale);

}  // namespace pipetrain::cuda
