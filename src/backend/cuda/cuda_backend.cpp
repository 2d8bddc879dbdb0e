// CudaBackend: the Backend interface on one GPU. Owns the device binding, a
// stream, a cuBLAS handle and a little scratch memory; checks arguments (throwing
// pipetrain::Error with the CPU backend's messages) and forwards every kernel to a
// launcher in pipetrain::cuda (one .cu file per kernel family), bf16 attention to
// cuDNN where it qualifies (cudnn_attention.hpp). Also exports
// make_cuda_backend(), cuda_available() and cuda_build_summary().
//
// Streams: all work goes to the backend's own stream, created blocking (it
// synchronises with the legacy default stream, so plain cudaMemcpy elsewhere stays
// ordered with it). copy() waits for the stream when host memory is involved.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "cuda_kernels.hpp"
#include "cudnn_attention.hpp"
#include "pipetrain/backend/backend.hpp"
#include "pipetrain/backend/cuda.hpp"
#include "pipetrain/core/error.hpp"

#ifndef PIPETRAIN_CUDA_ARCHS
#define PIPETRAIN_CUDA_ARCHS "90"
#endif

namespace pipetrain {
namespace cuda {

void cuda_fail(const char* call, cudaError_t err) {
  (void)cudaGetLastError();  // clear a non-sticky error so that later calls can proceed
  fail("CUDA error in {}: {} ({})", call, cudaGetErrorName(err), cudaGetErrorString(err));
}

void cublas_fail(const char* call, cublasStatus_t status) {
  fail("cuBLAS error in {}: {} ({})", call, cublas().cublasGetStatusName(status),
       cublas().cublasGetStatusString(status));
}

namespace {

std::string version_string(int v) { return fmt::format("{}.{}", v / 1000, (v % 1000) / 10); }

// nvidia-smi's form: "GPU-", then the 16 bytes in hex, grouped 8-4-4-4-12.
std::string gpu_uuid(const cudaUUID_t& id) {
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += fmt::format("{:02x}", static_cast<unsigned char>(id.bytes[i]));
  }
  return out;
}

// "90,80a" -> "sm_90, sm_80a"
std::string arch_list() {
  std::string in = PIPETRAIN_CUDA_ARCHS, out;
  size_t pos = 0;
  while (pos <= in.size()) {
    const size_t end = std::min(in.find(',', pos), in.size());
    if (end > pos) out += (out.empty() ? "sm_" : ", sm_") + in.substr(pos, end - pos);
    pos = end + 1;
  }
  return out;
}

// Node-local rank from the launcher's environment (Open MPI, Slurm, MPICH/Hydra).
int node_local_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"}) {
    const char* s = std::getenv(var);
    if (s == nullptr || *s == '\0') continue;
    int v = 0;
    const char* end = s + std::strlen(s);
    const auto [p, ec] = std::from_chars(s, end, v);
    if (ec == std::errc() && p == end && v >= 0) return v;
  }
  return 0;
}

// The backend's stream as a pipetrain Stream (communication orders itself against it).
class CudaStream final : public Stream {
 public:
  CudaStream(int device, cudaStream_t* stream) : device_(device), stream_(stream) {}
  DeviceId device() const override { return {DeviceKind::Cuda, device_}; }
  std::string name() const override { return "cuda:" + std::to_string(device_) + " compute"; }
  void synchronize() override { PIPETRAIN_CUDA_CHECK(cudaStreamSynchronize(*stream_)); }
  void* native_handle() const override { return *stream_; }

 private:
  int device_;
  cudaStream_t* stream_;
};

// Number of this shard's columns that are real (global index < V), in [0, Vl].
int real_columns(int Vl, int col_begin, int V) {
  const int64_t r = static_cast<int64_t>(V) - col_begin;
  return r <= 0 ? 0 : (r < Vl ? static_cast<int>(r) : Vl);
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {
    try {
      init();
    } catch (...) {
      release();
      throw;
    }
  }
  ~CudaBackend() override { release(); }
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  DeviceId device() const override { return {DeviceKind::Cuda, device_}; }
  Stream& stream() override { return stream_; }
  std::string name() const override { return name_; }
  std::string hardware_id() const override { return uuid_; }
  bool bf16_products_native() const override { return true; }

  // ---- memory ----
  void* allocate(size_t bytes) override {
    bind();
    void* p = nullptr;
    // cudaMalloc aligns to 256 bytes; a 0-byte request still gets a unique pointer.
    const cudaError_t err = cudaMalloc(&p, bytes == 0 ? 64 : bytes);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) (void)cudaGetLastError();
      fail("cuda backend: cannot allocate {} bytes on device {} ({}; {} of {} bytes free)", bytes,
           device_, cudaGetErrorString(err), free_b, total_b);
    }
    return p;
  }
  void deallocate(void* p, size_t bytes) override {
    if (p == nullptr) return;
    bind();
    // Never throws (called from destructors); an error here means an earlier kernel failed.
    const cudaError_t err = cudaFree(p);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      std::fprintf(stderr, "pipetrain: cuda backend: cudaFree of %zu bytes failed: %s\n", bytes,
                   cudaGetErrorString(err));
    }
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0 || dst == src) return;
    bind();
    // No pointer queries: a pageable host buffer on either side makes the copy return once
    // the host memory is safe (CUDA stages it), which is copy()'s contract; nothing here
    // passes pinned host memory to copy() (to_host / to_device synchronise for that).
    PIPETRAIN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, ctx_.stream));
  }
  void to_device(void* dst, const void* host_src, size_t bytes) override {
    if (bytes == 0) return;
    bind();
    PIPETRAIN_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyDefault, ctx_.stream));
    sync();
  }
  void to_host(void* host_dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    bind();
    PIPETRAIN_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDefault, ctx_.stream));
    sync();
  }
  void fill(float* x, float value, size_t n) override { cuda::fill(ctx(), x, value, n); }

  // ---- matrix products ----
  void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc) override {
    cuda::gemm(ctx(), trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  void gemm_grouped(bool trans_a, bool trans_b, float alpha, float beta, const std::vector<GemmProblem>& problems,
                    const std::function<void()>& /*between: one launch, the host is free meanwhile*/) override {
    cuda::gemm_grouped(ctx(), trans_a, trans_b, alpha, beta, problems);
  }
  // The product, then the bias and the residual with the elementwise kernels (row by row
  // when C has padding columns).
  void gemm_bias(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
                 float* C, int ldc, const float* bias, const float* residual) override {
    cuda::gemm(ctx(), trans_a, trans_b, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc);
    if (ldc == N) {
      if (bias) cuda::bias_add(ctx(), C, bias, M, N);
      if (residual) cuda::accumulate(ctx(), C, residual, static_cast<size_t>(M) * static_cast<size_t>(N));
      return;
    }
    for (int i = 0; i < M; ++i) {
      float* row = C + static_cast<size_t>(i) * static_cast<size_t>(ldc);
      if (bias) cuda::bias_add(ctx(), row, bias, 1, N);
      if (residual) cuda::accumulate(ctx(), row, residual + static_cast<size_t>(i) * static_cast<size_t>(ldc),
                                     static_cast<size_t>(N));
    }
  }
  void gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const bf16* A, int lda, const bf16* B,
                 int ldb, float beta, float* C, int ldc, Epilogue epilogue, const float* bias,
                 float* pre_gelu) override {
    if (epilogue != Epilogue::kNone && (beta != 0.0f || !bias || (epilogue == Epilogue::kBiasGelu && !pre_gelu)))
      fail("gemm_bf16: a bias epilogue needs beta = 0 and a bias (and pre_gelu for GELU)");
    // pipetrain's bf16 and CUDA's __nv_bfloat16 are both the 16 high bits of an IEEE f32.
    static_assert(sizeof(bf16) == sizeof(__nv_bfloat16));
    cuda::gemm_bf16(ctx(), trans_a, trans_b, M, N, K, alpha, reinterpret_cast<const __nv_bfloat16*>(A), lda,
                    reinterpret_cast<const __nv_bfloat16*>(B), ldb, beta, C, ldc, static_cast<int>(epilogue), bias,
                    pre_gelu);
  }
  void gemm_strided_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                            const float* A, int lda, long stride_a, const float* B, int ldb,
                            long stride_b, float beta, float* C, int ldc, long stride_c,
                            int batch) override {
    cuda::gemm_strided_batched(ctx(), trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb,
                               stride_b, beta, C, ldc, stride_c, batch);
  }

  // ---- elementwise and reductions ----
  void add(float* out, const float* a, const float* b, size_t n) override {
    cuda::add(ctx(), out, a, b, n);
  }
  void accumulate(float* out, const float* a, size_t n) override {
    cuda::accumulate(ctx(), out, a, n);
  }
  void scale(float* x, float s, size_t n) override { cuda::scale(ctx(), x, s, n); }
  void cast_to_bf16(bf16* out, const float* in, size_t n) override {
    cuda::cast_to_bf16(ctx(), reinterpret_cast<uint16_t*>(out), in, n);
  }
  void cast_to_f32(float* out, const bf16* in, size_t n) override {
    cuda::cast_to_f32(ctx(), out, reinterpret_cast<const uint16_t*>(in), n);
  }
  double sum_squares(const float* x, size_t n) override { return cuda::sum_squares(ctx(), x, n); }
  bool all_finite(const float* x, size_t n) override { return cuda::all_finite(ctx(), x, n); }
  void bias_add(float* out, const float* bias, int N, int C) override {
    cuda::bias_add(ctx(), out, bias, N, C);
  }
  void bias_backward(float* dbias, const float* dout, int N, int C) override {
    cuda::bias_backward(ctx(), dbias, dout, N, C);
  }

  // ---- GELU, LayerNorm, attention ----
  void gelu_forward(float* out, const float* inp, size_t n) override {
    cuda::gelu_forward(ctx(), out, inp, n);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) override {
    cuda::gelu_backward(ctx(), dinp, inp, dout, n);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int N, int C,
                         float eps) override {
    cuda::layernorm_forward(ctx(), out, mean, rstd, inp, weight, bias, N, C, eps);
  }
  void layernorm_backward_input(float* dinp, const float* dout, const float* inp,
                                const float* weight, const float* mean, const float* rstd, int N,
                                int C) override {
    cuda::layernorm_backward_input(ctx(), dinp, dout, inp, weight, mean, rstd, N, C);
  }
  void layernorm_backward_weight(float* dweight, float* dbias, const float* dout,
                                 const float* inp, const float* mean, const float* rstd, int N,
                                 int C) override {
    cuda::layernorm_backward_weight(ctx(), dweight, dbias, dout, inp, mean, rstd, N, C);
  }
  // Head sizes up to 128 run flash-style and keep each row's log-sum-exp plus the output
  // (D_i = dO_i . O_i in backward): O(T) per row. Larger heads keep the probabilities.
  struct FlashStash final : AttentionStash {
    Tensor lse, out;
    size_t bytes() const override { return lse.bytes() + out.bytes(); }
  };
  struct ProbabilityStash final : AttentionStash {
    Tensor att;
    size_t bytes() const override { return att.bytes(); }
  };
  static void check_heads(const char* kernel, int C, int NH, int NKV) {
    if (NH <= 0 || NKV <= 0 || NH % NKV != 0 || C % NH != 0)
      fail("{}: {} query heads, {} key/value heads and {} channels (need NKV | NH and NH | C)", kernel, NH, NKV, C);
    if (NKV != NH && C / NH > cuda::kMaxFlashHead)
      fail("{}: grouped-query attention on the GPU needs a head size <= {}, got {}", kernel, cuda::kMaxFlashHead,
           C / NH);
  }
  void attention_decode(float* out, const float* q, int ldq, const float* k, const float* v, int ldkv, int n,
                        int pos, int NH, int NKV, int hs) override {
    if (NKV < 1 || NH % NKV != 0) fail("attention_decode: {} query heads do not group over {} key/value heads", NH, NKV);
    if (decode_max_keys_ < 0) {
      bind();  // this device's attributes
      decode_max_keys_ = cuda::attention_decode_max_keys();
    }
    if (pos + n > decode_max_keys_)
      fail("attention_decode: {} cached tokens exceed the {} a block's scores fit in this GPU's shared memory", pos + n,
           decode_max_keys_);
    cuda::attention_decode(ctx(), out, q, ldq, k, v, ldkv, n, pos, NH, NKV, hs);
  }
  using Backend::attention_backward;  // the bf16-qkv forms: on cuDNN (below), or widened and then these
  using Backend::attention_forward;
  // bf16 qkv under bf16 storage without packed documents: cuDNN where it takes the shape
  // (cudnn_attention.hpp; PIPETRAIN_CUDNN_ATTENTION=0 turns it off), else widened onto the kernels.
  std::unique_ptr<AttentionStash> attention_forward(float* out, const bf16* qkv, int B, int T, int C, int NH, int NKV,
                                                    MemoryPool& pool, DType storage,
                                                    const int32_t* positions) override {
    check_heads("attention_forward", C, NH, NKV);
    if (storage == DType::BF16 && positions == nullptr)
      if (auto s = cudnn_attention_.forward(ctx(), out, reinterpret_cast<const uint16_t*>(qkv), B, T, C, NH, NKV, pool))
        return s;
    return Backend::attention_forward(out, qkv, B, T, C, NH, NKV, pool, storage, positions);
  }
  void attention_backward(float* dqkv, const float* dout, const bf16* qkv, AttentionStash& stash, int B, int T, int C,
                          int NH, int NKV, MemoryPool& pool, const int32_t* positions) override {
    auto* c = dynamic_cast<cuda::CudnnAttentionStash*>(&stash);
    if (c == nullptr) return Backend::attention_backward(dqkv, dout, qkv, stash, B, T, C, NH, NKV, pool, positions);
    check_heads("attention_backward", C, NH, NKV);
    if (positions != nullptr) fail("attention_backward: packed-document positions, but the forward ran without them");
    cudnn_attention_.backward(ctx(), dqkv, dout, reinterpret_cast<const uint16_t*>(qkv), *c, B, T, C, NH, NKV, pool);
  }
  // Packed documents (positions): the flash kernels recompute the probabilities, so both
  // passes take them; the probability kernels keep 0 for other documents' keys, so their
  // backward needs none.
  std::unique_ptr<AttentionStash> attention_forward(float* out, const float* qkv, int B, int T, int C, int NH, int NKV,
                                                    MemoryPool& pool, DType /*storage*/,
                                                    const int32_t* positions) override {
    check_heads("attention_forward", C, NH, NKV);
    if (C / NH <= cuda::kMaxFlashHead) {
      auto s = std::make_unique<FlashStash>();
      s->lse = Tensor::empty(pool, {B, NH, T});
      s->out = Tensor::empty(pool, {B, T, C});
      cuda::flash_attention_forward(ctx(), out, s->lse.f32(), qkv, B, T, C, NH, NKV, positions);
      copy(s->out.f32(), out, s->out.bytes());
      return s;
    }
    auto s = std::make_unique<ProbabilityStash>();
    s->att = Tensor::empty(pool, {B, NH, T, T});
    cuda::attention_forward(ctx(), out, s->att.f32(), qkv, B, T, C, NH, positions);
    return s;
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, AttentionStash& stash, int B, int T, int C,
                          int NH, int NKV, MemoryPool& pool, const int32_t* positions) override {
    check_heads("attention_backward", C, NH, NKV);
    if (dynamic_cast<cuda::CudnnAttentionStash*>(&stash) != nullptr)
      fail("attention_backward: the stash is cuDNN attention's, from bf16 qkv: pass that bf16 qkv");
    if (auto* f = dynamic_cast<FlashStash*>(&stash)) {
      const Tensor delta = Tensor::empty(pool, {B, NH, T});
      cuda::flash_attention_backward(ctx(), dqkv, delta.f32(), dout, qkv, f->out.f32(), f->lse.f32(), B, T, C, NH, NKV,
                                     positions);
      return;
    }
    const Tensor scratch = Tensor::empty(pool, {B, NH, T, T});
    cuda::attention_backward(ctx(), dqkv, scratch.f32(), dout, qkv, static_cast<ProbabilityStash&>(stash).att.f32(),
                             B, T, C, NH);
  }
  // Context parallelism's ring (attention_block.cu): flash style, no workspace from the pool.
  static void check_block_heads(const char* kernel, int NH, int NKV, int hs) {
    if (NH <= 0 || NKV <= 0 || NH % NKV != 0 || hs <= 0 || hs > cuda::kMaxBlockHead)
      fail(
          "{}: the cuda backend takes {} query heads over {} key/value heads of size {} (need NKV | NH and a head "
          "size in [1, {}])",
          kernel, NH, NKV, hs, cuda::kMaxBlockHead);
  }
  void attention_block_forward(float* out, float* lse, const float* q, int ldq, const float* k, const float* v,
                               int ldkv, const int32_t* qpos, const int32_t* qstart, const int32_t* kpos, int B, int Tq,
                               int Tk, int NH, int NKV, int hs, MemoryPool& /*pool*/) override {
    check_block_heads("attention_block_forward", NH, NKV, hs);
    cuda::attention_block_forward(ctx(), out, lse, q, ldq, k, v, ldkv, qpos, qstart, kpos, B, Tq, Tk, NH, NKV, hs);
  }
  void attention_merge(float* out, float* lse, const float* block_out, const float* block_lse, int B, int T, int NH,
                       int hs) override {
    cuda::attention_merge(ctx(), out, lse, block_out, block_lse, B, T, NH, hs);
  }
  void attention_delta(float* delta, const float* dout, const float* out, int B, int T, int NH, int hs) override {
    cuda::attention_delta(ctx(), delta, dout, out, B, T, NH, hs);
  }
  void attention_block_backward(float* dq, int lddq, float* dk, float* dv, int lddkv, const float* dout,
                                const float* delta, const float* lse, const float* q, int ldq, const float* k,
                                const float* v, int ldkv, const int32_t* qpos, const int32_t* qstart,
                                const int32_t* kpos, int B, int Tq, int Tk, int NH, int NKV, int hs,
                                MemoryPool& /*pool*/) override {
    check_block_heads("attention_block_backward", NH, NKV, hs);
    cuda::attention_block_backward(ctx(), dq, lddq, dk, dv, lddkv, dout, delta, lse, q, ldq, k, v, ldkv, qpos, qstart,
                                   kpos, B, Tq, Tk, NH, NKV, hs);
  }

  // ---- Llama ----
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                       float eps) override {
    cuda::rmsnorm_forward(ctx(), out, rstd, inp, weight, N, C, eps);
  }
  void rmsnorm_backward_input(float* dinp, const float* dout, const float* inp, const float* weight,
                              const float* rstd, int N, int C) override {
    cuda::rmsnorm_backward_input(ctx(), dinp, dout, inp, weight, rstd, N, C);
  }
  void rmsnorm_backward_weight(float* dweight, const float* dout, const float* inp, const float* rstd, int N,
                               int C) override {
    cuda::rmsnorm_backward_weight(ctx(), dweight, dout, inp, rstd, N, C);
  }
  void rope(float* x, int B, int T, int ld, int heads, int head_size, float theta, bool inverse, int pos0,
            const int32_t* positions) override {
    if (head_size % 2 != 0) fail("rope: head size {} is odd (channels rotate in pairs)", head_size);
    cuda::rope(ctx(), x, B, T, ld, heads, head_size, theta, inverse, pos0, positions);
  }
  void gather_rows(float* out, const float* in, const int32_t* index, const float* scale, int rows, int C) override {
    cuda::gather_rows(ctx(), out, in, index, scale, rows, C);
  }
  void combine_rows(float* out, const float* in, const int32_t* row, const float* weight, int N, int k,
                    int C) override {
    cuda::combine_rows(ctx(), out, in, row, weight, N, k, C);
  }
  void row_dots(float* out, const float* a, const float* b, const int32_t* row, int N, int k, int C) override {
    cuda::row_dots(ctx(), out, a, b, row, N, k, C);
  }
  RouteCounts moe_route(const RoutedArrays& out, const float* logits, const float* bias, int N, const RouterSpec& spec,
                        MemoryPool& pool) override {
    if (spec.experts < 1 || spec.top_k < 1 || spec.top_k > spec.experts)
      fail("moe_route: top_k {} of {} experts", spec.top_k, spec.experts);
    const auto scratch = pool.acquire(cuda::moe_route_scratch_bytes(N, spec.experts, spec.top_k));
    return cuda::moe_route(ctx(), out, logits, bias, N, spec, kept_rows_limit(spec, N), scratch->ptr);
  }
  void moe_router_backward(float* dlogits, const RoutedArrays& r, const float* logits, const float* dweight, int N,
                           const RouterSpec& spec, double scale) override {
    cuda::moe_router_backward(ctx(), dlogits, r, logits, dweight, N, spec, scale);
  }
  void swiglu_forward(float* out, const float* g, const float* u, size_t n) override {
    cuda::swiglu_forward(ctx(), out, g, u, n);
  }
  void swiglu_backward(float* dg, float* du, const float* dout, const float* g, const float* u, size_t n) override {
    cuda::swiglu_backward(ctx(), dg, du, dout, g, u, n);
  }

  // ---- embedding ----
  void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                         int B, int T, int C) override {
    check_tokens(tokens, static_cast<int64_t>(B) * T);
    cuda::embedding_forward(ctx(), out, tokens, wte, wpe, B, T, C);
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                          int B, int T, int C) override {
    check_tokens(tokens, static_cast<int64_t>(B) * T);
    if (B <= 0 || T <= 0) return;
    cuda::embedding_scatter(ctx(), dwte, dout, tokens, 0, std::numeric_limits<int32_t>::max(),
                            B * T, C);
    cuda::position_backward(ctx(), dwpe, dout, B, T, C, nullptr);
  }
  void embedding_lookup(float* out, const int32_t* tokens, const float* wte, int row_begin,
                        int row_end, int N, int C) override {
    check_shape("embedding_lookup", N, C);
    check_range("embedding_lookup", row_begin, row_end);
    cuda::embedding_lookup(ctx(), out, tokens, wte, row_begin, row_end, N, C);
  }
  void embedding_scatter(float* dwte, const float* dout, const int32_t* tokens, int row_begin,
                         int row_end, int N, int C) override {
    check_shape("embedding_scatter", N, C);
    check_range("embedding_scatter", row_begin, row_end);
    cuda::embedding_scatter(ctx(), dwte, dout, tokens, row_begin, row_end, N, C);
  }
  void embedding_lookup(float* out, const int32_t* tokens, const bf16* wte, int row_begin, int row_end, int N,
                        int C) override {
    check_shape("embedding_lookup", N, C);
    check_range("embedding_lookup", row_begin, row_end);
    cuda::embedding_lookup(ctx(), out, tokens, reinterpret_cast<const uint16_t*>(wte), row_begin, row_end, N, C);
  }
  void position_add(float* out, const bf16* wpe, int B, int T, int C, const int32_t* positions) override {
    if (B < 0 || T < 0) fail("position_add: negative size (B={}, T={})", B, T);
    check_shape("position_add", static_cast<int64_t>(B) * T, C);
    cuda::position_add(ctx(), out, reinterpret_cast<const uint16_t*>(wpe), B, T, C, positions);
  }
  void position_add(float* out, const float* wpe, int B, int T, int C, const int32_t* positions) override {
    if (B < 0 || T < 0) fail("position_add: negative size (B={}, T={})", B, T);
    check_shape("position_add", static_cast<int64_t>(B) * T, C);
    cuda::position_add(ctx(), out, wpe, B, T, C, positions);
  }
  void position_backward(float* dwpe, const float* dout, int B, int T, int C, const int32_t* positions) override {
    if (B < 0 || T < 0) fail("position_backward: negative size (B={}, T={})", B, T);
    check_shape("position_backward", static_cast<int64_t>(B) * T, C);
    cuda::position_backward(ctx(), dwpe, dout, B, T, C, positions);
  }

  // ---- cross-entropy ----
  void crossentropy_local_max(float* rowmax, const float* logits, int N, int Vl, int col_begin,
                              int V) override {
    check_ce_args("crossentropy_local_max", N, Vl, col_begin, V);
    cuda::crossentropy_local_max(ctx(), rowmax, logits, N, Vl, real_columns(Vl, col_begin, V));
  }
  void crossentropy_local_sums(float* sumexp, float* target_logit, const float* logits,
                               const float* rowmax, const int32_t* targets, int N, int Vl,
                               int col_begin, int V) override {
    check_ce_args("crossentropy_local_sums", N, Vl, col_begin, V);
    check_targets("crossentropy_local_sums", targets, N, V);
    cuda::crossentropy_local_sums(ctx(), sumexp, target_logit, logits, rowmax, targets, N, Vl,
                                  col_begin, real_columns(Vl, col_begin, V));
  }
  void crossentropy_finish(float* losses, float* logits, const float* rowmax, const float* sumexp,
                           const float* target_logit, const int32_t* targets, int N, int Vl,
                           int col_begin, int V, float grad_scale) override {
    check_ce_args("crossentropy_finish", N, Vl, col_begin, V);
    check_targets("crossentropy_finish", targets, N, V);
    cuda::crossentropy_finish(ctx(), losses, logits, rowmax, sumexp, target_logit, targets, N, Vl,
                              col_begin, real_columns(Vl, col_begin, V), grad_scale);
  }
  void crossentropy_forward(float* losses, float* logits, const int32_t* targets, int N, int V,
                            int Vp, float grad_scale) override {
    if (V <= 0 || Vp < V) fail("crossentropy: need 0 < V <= Vp, got V={} Vp={}", V, Vp);
    check_targets("crossentropy", targets, N, V);
    cuda::crossentropy_forward(ctx(), losses, logits, targets, N, V, Vp, grad_scale);
  }

  // ---- optimizer ----
  void adamw(float* params, const float* grads, float* m, float* v, size_t n, float lr,
             float beta1, float beta2, float eps, float weight_decay, int step,
             float grad_scale) override {
    if (step < 1) fail("adamw: step must start at 1, got {}", step);
    const auto inv_c1 = static_cast<float>(1.0 / (1.0 - std::pow(double{beta1}, step)));
    const auto inv_c2 = static_cast<float>(1.0 / (1.0 - std::pow(double{beta2}, step)));
    cuda::adamw(ctx(), params, grads, m, v, n, lr, beta1, beta2, eps, weight_decay, inv_c1,
                inv_c2, grad_scale);
  }

 private:
  void init() {
    PIPETRAIN_CUDA_CHECK(cudaSetDevice(device_));
    cudaDeviceProp prop{};
    PIPETRAIN_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
    PIPETRAIN_CUDA_CHECK(cudaStreamCreate(&ctx_.stream));
    PIPETRAIN_CUBLAS_CHECK(cublas().cublasCreate(&ctx_.blas));
    PIPETRAIN_CUBLAS_CHECK(cublas().cublasSetStream(ctx_.blas, ctx_.stream));
    const char* tf32 = std::getenv("PIPETRAIN_CUDA_TF32");
    const bool use_tf32 = tf32 != nullptr && std::strcmp(tf32, "1") == 0;
    PIPETRAIN_CUBLAS_CHECK(
        cublas().cublasSetMathMode(ctx_.blas, use_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    PIPETRAIN_CUDA_CHECK(cudaMalloc(&ctx_.scratch, cuda::kScratchBytes));
    PIPETRAIN_CUBLAS_CHECK(cublas().cublasLtCreate(&ctx_.lt));
    PIPETRAIN_CUDA_CHECK(cudaMalloc(&ctx_.lt_workspace, cuda::kLtWorkspaceBytes));
    uuid_ = gpu_uuid(prop.uuid);
    PIPETRAIN_CUDA_CHECK(cudaMalloc(&deferred_slots_, kDeferredSlots * sizeof *deferred_slots_));
    PIPETRAIN_CUDA_CHECK(cudaMemset(deferred_slots_, 0xff, kDeferredSlots * sizeof *deferred_slots_));
    const int sms = prop.multiProcessorCount > 0 ? prop.multiProcessorCount : 1;
    ctx_.max_blocks = static_cast<unsigned>(sms) * 8u;
    int runtime = 0, blas = 0;
    PIPETRAIN_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
    PIPETRAIN_CUBLAS_CHECK(cublas().cublasGetVersion(ctx_.blas, &blas));
    name_ = fmt::format("cuda (device {}: {}, sm_{}{}, {:.0f} GiB, CUDA {}, cuBLAS {}.{}.{}, {})",
                        device_, prop.name, prop.major, prop.minor,
                        static_cast<double>(prop.totalGlobalMem) / (1 << 30),
                        version_string(runtime), blas / 10000, blas / 100 % 100, blas % 100,
                        use_tf32 ? "TF32" : "fp32");
  }
  void release() noexcept {
    (void)cudaSetDevice(device_);
    if (ctx_.stream != nullptr) (void)cudaStreamSynchronize(ctx_.stream);
    cudnn_attention_.release();  // its handle is bound to the stream
    if (ctx_.blas != nullptr) (void)cublas().cublasDestroy(ctx_.blas);
    if (ctx_.stream != nullptr) (void)cudaStreamDestroy(ctx_.stream);
    if (ctx_.scratch != nullptr) (void)cudaFree(ctx_.scratch);
    if (ctx_.lt != nullptr) (void)cublas().cublasLtDestroy(ctx_.lt);
    if (ctx_.lt_workspace != nullptr) (void)cudaFree(ctx_.lt_workspace);
    if (deferred_slots_ != nullptr) (void)cudaFree(deferred_slots_);
    deferred_slots_ = nullptr;
    ctx_ = cuda::Ctx{};
    (void)cudaGetLastError();
  }
  // The current device is per host thread: set it before any work, once per thread and
  // device (no cudaSetDevice per kernel; pipetrain runs one GPU per rank).
  void bind() const {
    thread_local int bound = -1;
    if (bound == device_) return;
    PIPETRAIN_CUDA_CHECK(cudaSetDevice(device_));
    bound = device_;
  }
  const cuda::Ctx& ctx() const {
    bind();
    return ctx_;
  }
  void sync() const { PIPETRAIN_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream)); }

  // The checks of the CPU backend, with the same messages; those that look at device data
  // wait for the stream once per call, before any output is written, or under defer_checks
  // are read back once a step (the kernels meanwhile read no row for a bad id).
  void check_tokens(const int32_t* tokens, int64_t n) { check_ids({"embedding", 0, int64_t{1} << 32}, tokens, n); }
  // Targets in [0, V) or kIgnoredTarget: the range starts at -1, the value just below 0.
  void check_targets(const char* kernel, const int32_t* targets, int N, int V) {
    static_assert(kIgnoredTarget == -1, "check_targets lets through [kIgnoredTarget, V)");
    check_ids({kernel, kIgnoredTarget, V}, targets, N);
  }
  // Ids (tokens, targets) inside [lo, hi): at once, or recorded for check_deferred.
  struct IdCheck {
    const char* kernel;
    int64_t lo, hi;
    [[noreturn]] void fail_at(int64_t i, int32_t value) const {
      if (hi == int64_t{1} << 32) fail("{}: token {} at position {} is negative", kernel, value, i);
      fail("{}: target {} at row {} is outside the vocabulary [0, {})", kernel, value, i, hi);
    }
  };
  void check_ids(const IdCheck& c, const int32_t* ids, int64_t n) {
    if (!defer_) {
      int32_t value = 0;
      const int64_t i = cuda::first_out_of_range(ctx(), ids, n, c.lo, c.hi, &value);
      if (i >= 0) c.fail_at(i, value);
      return;
    }
    if (deferred_.size() == kDeferredSlots) check_deferred();  // full: settle these first (rare)
    cuda::record_out_of_range(ctx(), deferred_slots_ + deferred_.size(), ids, n, c.lo, c.hi);
    deferred_.push_back(c);
  }

 public:
  void defer_checks(bool on) override {
    if (!on) check_deferred();
    defer_ = on;
  }
  // One wait for every check recorded since the last: the first that failed, in order.
  void check_deferred() override {
    if (deferred_.empty()) return;
    std::vector<unsigned long long> got(deferred_.size());
    PIPETRAIN_CUDA_CHECK(
        cudaMemcpyAsync(got.data(), deferred_slots_, got.size() * sizeof got[0], cudaMemcpyDeviceToHost, ctx().stream));
    sync();
    const std::vector<IdCheck> checks = std::move(deferred_);
    deferred_.clear();
    PIPETRAIN_CUDA_CHECK(cudaMemsetAsync(deferred_slots_, 0xff, got.size() * sizeof got[0], ctx().stream));
    for (size_t k = 0; k < got.size(); ++k)
      if (got[k] != ~0ull) checks[k].fail_at(static_cast<int64_t>(got[k] >> 32), static_cast<int32_t>(got[k]));
  }

 private:
  static void check_ce_args(const char* kernel, int N, int Vl, int col_begin, int V) {
    if (V <= 0 || N < 0 || Vl < 0 || col_begin < 0) {
      fail("{}: need V > 0 and N, Vl, col_begin >= 0, got N={} Vl={} col_begin={} V={}", kernel,
           N, Vl, col_begin, V);
    }
  }
  static void check_shape(const char* kernel, int64_t rows, int C) {
    if (rows < 0 || C < 0) fail("{}: negative size (rows={}, C={})", kernel, rows, C);
  }
  static void check_range(const char* kernel, int row_begin, int row_end) {
    if (row_begin < 0 || row_end < row_begin) {
      fail("{}: invalid row range [{}, {})", kernel, row_begin, row_end);
    }
  }

  int device_;
  cuda::Ctx ctx_;
  CudaStream stream_{device_, &ctx_.stream};
  std::string name_;
  std::string uuid_;  // "GPU-" and the 16 bytes of cudaDeviceProp::uuid, as nvidia-smi prints them
  // Deferred id checks (defer_checks): kDeferredSlots device records, all bits set when
  // clear, and what each recorded check reports.
  static constexpr size_t kDeferredSlots = 256;
  unsigned long long* deferred_slots_ = nullptr;
  std::vector<IdCheck> deferred_;
  bool defer_ = false;
  int decode_max_keys_ = -1;  // cuda::attention_decode_max_keys, asked at the first decode
  // cuDNN attention's plans, one per shape and pass, built at first use (cudnn_attention.hpp).
  cuda::CudnnAttention cudnn_attention_;
};

}  // namespace
}  // namespace cuda

bool cuda_available(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  std::string reason;
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    reason = fmt::format("cudaGetDeviceCount: {}", cudaGetErrorString(err));
  } else if (count == 0) {
    reason = "no CUDA device is visible";
  }
  if (why != nullptr) *why = reason;
  return reason.empty();
}

std::unique_ptr<Backend> make_cuda_backend(int device) {
  std::string why;
  if (!cuda_available(&why)) fail("cuda backend: no usable GPU ({})", why);
  int count = 0;
  PIPETRAIN_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (device == -1) {
    device = cuda::node_local_rank() % count;
  } else if (device < 0 || device >= count) {
    fail("cuda backend: device {} requested, but {} device(s) are visible", device, count);
  }
  return std::make_unique<cuda::CudaBackend>(device);
}

std::string cuda_build_summary() {
  int runtime = 0;
  if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) {
    (void)cudaGetLastError();
    runtime = CUDART_VERSION;
  }
  return fmt::format("CUDA {}, built for {}", cuda::version_string(runtime), cuda::arch_list());
}

}  // namespace pipetrain
