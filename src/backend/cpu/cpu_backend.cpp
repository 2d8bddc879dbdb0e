// CpuBackend: the Backend interface on host memory. Memory management lives
// here; every kernel forwards to a free function in pipetrain::cpu (one file
// per kernel family). Also exports make_cpu_backend(), blas_kernel_name() and
// set_blas_threads() (the BLAS's threads and oneDNN's).
#include <cblas.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cpu_kernels.hpp"
#include "pipetrain/core/host_allocator.hpp"
#include "pipetrain/backend/backend.hpp"
#include "pipetrain/backend/blas_threads.hpp"
#include "pipetrain/backend/blas_kernel.hpp"
#include "pipetrain/core/error.hpp"

namespace pipetrain {
namespace cpu {
namespace {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(Bf16Products bf16_path) : bf16_path_(bf16_path) {}
  DeviceId device() const override { return {DeviceKind::Host, 0}; }
  Stream& stream() override { return host_stream(); }
  std::string name() const override {
    const std::string bf16 = bf16_path_ == bf16_products()         ? bf16_products_summary()
                             : bf16_path_ == Bf16Products::kOnednn ? onednn_description()
                                                                   : std::string("sgemm on widened operands");
    return std::string("cpu (Kokkos ") + HostSpace::name() + ", BLAS " + blas_kernel_summary() + ", " +
           blas_threads_summary() + "; bf16 products: " + bf16 +
           dense_paths_summary() + ")";
  }

  // The dense layers' products where they do not all run in the BLAS.
  std::string dense_paths_summary() const {
    std::string s;
    for (const DenseProduct p : {kForward, kInputGradient, kWeightGradient})
      if (library_[p] == ProductLibrary::Onednn) s += std::string(s.empty() ? "" : ", ") + product_name(p);
    if (!s.empty()) s = "; dense " + s + " products by oneDNN's sgemm";
    if (packed_) s += "; dense products by weights packed for " + onednn_description();
    return s;
  }

  void* allocate(size_t bytes) override { return memory_.allocate(bytes); }
  void deallocate(void* p, size_t bytes) override { memory_.deallocate(p, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes != 0 && dst != src) std::memcpy(dst, src, bytes);
  }
  void fill(float* x, float value, size_t n) override { cpu::fill(x, value, n); }

  void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc) override {
    cpu::gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  void gemm_bias(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
                 float* C, int ldc, const float* bias, const float* residual) override {
    cpu::gemm_bias(trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, bias, residual);
  }
  void dense_forward(int rows, int out, int in, const float* x, const float* w, float* y, const float* bias,
                     const float* residual) override {
    if (!packed_ || !packed_->forward(rows, out, in, x, w, y, bias, residual))
      cpu::gemm_bias(false, true, rows, out, in, x, in, w, in, y, out, bias, residual, library_[kForward]);
  }
  void dense_backward_input(int rows, int out, int in, const float* dy, const float* w, float* dx) override {
    if (!packed_ || !packed_->backward_input(rows, out, in, dy, w, dx))
      cpu::gemm_in(library_[kInputGradient], false, false, rows, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
  }
  void dense_backward_weight(int rows, int out, int in, const float* dy, const float* x, float* dw) override {
    cpu::gemm_in(library_[kWeightGradient], true, false, out, in, rows, 1.0f, dy, out, x, in, 1.0f, dw, in);
  }
  bool set_dense_paths(const DensePaths& paths) override {
    const bool onednn = std::any_of(paths.library.begin(), paths.library.end(),
                                    [](ProductLibrary l) { return l == ProductLibrary::Onednn; });
    if (onednn && !cpu::onednn_built_in()) return false;
    if (!set_pack_weights(!paths.packed.empty())) return false;
    if (packed_) packed_->only(paths.packed);
    library_ = paths.library;
    return true;
  }
  std::optional<DenseProductTimes> time_dense_products(DenseShape shape, int rows) override {
    return cpu::time_dense_products(shape, rows);
  }
  void hold_weights(bool held) override {
    if (packed_) packed_->hold(held);
  }
  bool set_pack_weights(bool on) override {
    if (on && !packed_) packed_ = PackedDense::make();
    if (!on) packed_.reset();
    if (packed_) packed_->only({});
    return on == (packed_ != nullptr);
  }
  int refresh_packed_weights_until(const std::function<bool()>& arrived) override {
    return packed_ ? packed_->refresh_until(arrived) : 0;
  }
  void forget_packed_weights() override {
    if (packed_) packed_->forget();
  }
  PackedWeights packed_weights() const override {
    if (!packed_) return {};
    const auto [elements, bytes] = packed_->held_copies();
    return {elements, bytes};
  }
  void gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const bf16* A, int lda, const bf16* B,
                 int ldb, float beta, float* C, int ldc, Epilogue epilogue, const float* bias,
                 float* pre_gelu) override {
    cpu::gemm_bf16(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, epilogue, bias, pre_gelu,
                   gemm_scratch_, bf16_path_);
  }
  bool bf16_products_native() const override { return bf16_path_ == Bf16Products::kOnednn; }
  void gemm_strided_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                            const float* A, int lda, long stride_a, const float* B, int ldb,
                            long stride_b, float beta, float* C, int ldc, long stride_c,
                            int batch) override {
    cpu::gemm_strided_batched(trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb,
                              stride_b, beta, C, ldc, stride_c, batch);
  }

  void add(float* out, const float* a, const float* b, size_t n) override {
    cpu::add(out, a, b, n);
  }
  void accumulate(float* out, const float* a, size_t n) override { cpu::accumulate(out, a, n); }
  void scale(float* x, float s, size_t n) override { cpu::scale(x, s, n); }
  void cast_to_bf16(bf16* out, const float* in, size_t n) override { cpu::cast_to_bf16(out, in, n); }
  void cast_to_f32(float* out, const bf16* in, size_t n) override { cpu::cast_to_f32(out, in, n); }
  void round_to_bf16(bf16* out, float* x, size_t n) override { cpu::round_to_bf16(out, x, n); }
  double sum_squares(const float* x, size_t n) override { return cpu::sum_squares(x, n); }
  bool all_finite(const float* x, size_t n) override { return cpu::all_finite(x, n); }
  void bias_add(float* out, const float* bias, int N, int C) override {
    cpu::bias_add(out, bias, N, C);
  }
  void bias_backward(float* dbias, const float* dout, int N, int C) override {
    cpu::bias_backward(dbias, dout, N, C);
  }

  void gelu_forward(float* out, const float* inp, size_t n) override {
    cpu::gelu_forward(out, inp, n);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) override {
    cpu::gelu_backward(dinp, inp, dout, n);
  }

  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int N, int C,
                         float eps) override {
    cpu::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, eps);
  }
  void layernorm_backward_input(float* dinp, const float* dout, const float* inp,
                                const float* weight, const float* mean, const float* rstd, int N,
                                int C) override {
    cpu::layernorm_backward_input(dinp, dout, inp, weight, mean, rstd, N, C);
  }
  void layernorm_backward_weight(float* dweight, float* dbias, const float* dout,
                                 const float* inp, const float* mean, const float* rstd, int N,
                                 int C) override {
    cpu::layernorm_backward_weight(dweight, dbias, dout, inp, mean, rstd, N, C);
  }

  // The probabilities, kept for backward (one pass of products each way, no recompute),
  // block by block without the causal upper triangle (pipetrain/backend/attention.hpp), in
  // the storage precision: bf16 storage keeps them as bf16 (written so by the softmax itself
  // where the products take bf16 operands too: bf16_attention).
  struct ProbabilityStash final : AttentionStash {
    Tensor att;
    size_t bytes() const override { return att.bytes(); }
  };
  void attention_decode(float* out, const float* q, int ldq, const float* k, const float* v, int ldkv, int n,
                        int pos, int NH, int NKV, int hs) override {
    if (NKV < 1 || NH % NKV != 0) fail("attention_decode: {} query heads do not group over {} key/value heads", NH, NKV);
    cpu::attention_decode(out, q, ldq, k, v, ldkv, n, pos, NH, NKV, hs);
  }
  // The backward needs no positions: a probability kept as 0 (a key of another document)
  // gets a 0 gradient.
  std::unique_ptr<AttentionStash> attention_forward(float* out, const float* qkv, int B, int T, int C, int NH, int NKV,
                                                    MemoryPool& pool, DType storage,
                                                    const int32_t* positions) override {
    check_heads("attention_forward", C, NH, NKV);
    if (bf16_attention(storage)) return forward_bf16(out, qkv, B, T, C, NH, NKV, pool, positions);
    auto s = std::make_unique<ProbabilityStash>();
    Tensor att = Tensor::empty(pool, {B, NH, causal_block_elements(T)});
    cpu::attention_forward(out, att.f32(), qkv, B, T, C, NH, NKV, positions);
    if (storage == DType::BF16) {
      s->att = Tensor::empty(pool, att.shape(), DType::BF16);
      cpu::cast_to_bf16(s->att.bf16_data(), att.f32(), static_cast<size_t>(att.numel()));
    } else {
      s->att = std::move(att);
    }
    return s;
  }
  std::unique_ptr<AttentionStash> attention_forward(float* out, const bf16* qkv, int B, int T, int C, int NH, int NKV,
                                                    MemoryPool& pool, DType storage,
                                                    const int32_t* positions) override {
    check_heads("attention_forward", C, NH, NKV);
    if (bf16_attention(storage)) return forward_bf16(out, qkv, B, T, C, NH, NKV, pool, positions);
    return Backend::attention_forward(out, qkv, B, T, C, NH, NKV, pool, storage, positions);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, AttentionStash& stash, int B, int T, int C,
                          int NH, int NKV, MemoryPool& pool, const int32_t*) override {
    check_heads("attention_backward", C, NH, NKV);
    const Tensor& kept = static_cast<ProbabilityStash&>(stash).att;
    if (bf16_attention(kept.dtype())) return backward_bf16(dqkv, dout, qkv, kept, B, T, C, NH, NKV, pool);
    Tensor att = kept;
    if (kept.dtype() == DType::BF16) {
      att = Tensor::empty(pool, kept.shape());
      cpu::cast_to_f32(att.f32(), kept.bf16_data(), static_cast<size_t>(kept.numel()));
    }
    const Tensor scratch = Tensor::empty(pool, {B, NH, causal_block_elements(T)});
    cpu::attention_backward(dqkv, scratch.f32(), dout, qkv, att.f32(), B, T, C, NH, NKV);
  }
  void attention_backward(float* dqkv, const float* dout, const bf16* qkv, AttentionStash& stash, int B, int T, int C,
                          int NH, int NKV, MemoryPool& pool, const int32_t* positions) override {
    check_heads("attention_backward", C, NH, NKV);
    const Tensor& kept = static_cast<ProbabilityStash&>(stash).att;
    if (bf16_attention(kept.dtype())) return backward_bf16(dqkv, dout, qkv, kept, B, T, C, NH, NKV, pool);
    Backend::attention_backward(dqkv, dout, qkv, stash, B, T, C, NH, NKV, pool, positions);
  }
  void attention_block_forward(float* out, float* lse, const float* q, int ldq, const float* k, const float* v,
                               int ldkv, const int32_t* qpos, const int32_t* qstart, const int32_t* kpos, int B, int Tq,
                               int Tk, int NH, int NKV, int hs, MemoryPool& pool) override {
    check_heads("attention_block_forward", NH * hs, NH, NKV);
    const Tensor scores = Tensor::empty(pool, {kAttnBlock, std::max(Tk, 1)});
    cpu::attention_block_forward(out, lse, q, ldq, k, v, ldkv, qpos, qstart, kpos, B, Tq, Tk, NH, NKV, hs,
                                 scores.f32());
  }
  void attention_merge(float* out, float* lse, const float* block_out, const float* block_lse, int B, int T, int NH,
                       int hs) override {
    cpu::attention_merge(out, lse, block_out, block_lse, B, T, NH, hs);
  }
  void attention_delta(float* delta, const float* dout, const float* out, int B, int T, int NH, int hs) override {
    cpu::attention_delta(delta, dout, out, B, T, NH, hs);
  }
  void attention_block_backward(float* dq, int lddq, float* dk, float* dv, int lddkv, const float* dout,
                                const float* delta, const float* lse, const float* q, int ldq, const float* k,
                                const float* v, int ldkv, const int32_t* qpos, const int32_t* qstart,
                                const int32_t* kpos, int B, int Tq, int Tk, int NH, int NKV, int hs,
                                MemoryPool& pool) override {
    check_heads("attention_block_backward", NH * hs, NH, NKV);
    const Tensor p = Tensor::empty(pool, {kAttnBlock, std::max(Tk, 1)}),
                 ds = Tensor::empty(pool, {kAttnBlock, std::max(Tk, 1)});
    cpu::attention_block_backward(dq, lddq, dk, dv, lddkv, dout, delta, lse, q, ldq, k, v, ldkv, qpos, qstart, kpos, B,
                                  Tq, Tk, NH, NKV, hs, p.f32(), ds.f32());
  }
  // attention_bf16.cpp's forms, qkv in f32 (bf16 values) or bf16; workspace from `pool`.
  template <class Q>
  std::unique_ptr<AttentionStash> forward_bf16(float* out, const Q* qkv, int B, int T, int C, int NH, int NKV,
                                               MemoryPool& pool, const int32_t* positions) {
    auto s = std::make_unique<ProbabilityStash>();
    s->att = Tensor::empty(pool, {B, NH, causal_block_elements(T)}, DType::BF16);
    const Tensor heads = Tensor::empty(pool, {T, qkv_width(C, NH, NKV)}, DType::BF16);
    const Tensor scores = Tensor::empty(pool, {kAttnBlock, T});
    const Tensor out_heads = Tensor::empty(pool, {T, C});
    cpu::attention_forward_bf16(out, s->att.bf16_data(), qkv, heads.bf16_data(), scores.f32(), out_heads.f32(), B, T, C,
                                NH, NKV, gemm_scratch_, positions);
    return s;
  }
  template <class Q>
  void backward_bf16(float* dqkv, const float* dout, const Q* qkv, const Tensor& kept, int B, int T, int C, int NH,
                     int NKV, MemoryPool& pool) {
    const int R = qkv_width(C, NH, NKV);
    const Tensor heads = Tensor::empty(pool, {T, R}, DType::BF16), grad_heads = Tensor::empty(pool, {T, R});
    const Tensor dout_heads = Tensor::empty(pool, {T, C}, DType::BF16);
    const Tensor dp = Tensor::empty(pool, {kAttnBlock, T}), ds = Tensor::empty(pool, {kAttnBlock, T}, DType::BF16);
    cpu::attention_backward_bf16(dqkv, dout, qkv, kept.bf16_data(), heads.bf16_data(), dout_heads.bf16_data(),
                                 grad_heads.f32(), dp.f32(), ds.bf16_data(), B, T, C, NH, NKV, gemm_scratch_);
  }
  // bf16 storage where the products take bf16 operands too: attention multiplies bf16
  // (attention_bf16.cpp); elsewhere it multiplies f32 and keeps P in `storage`.
  bool bf16_attention(DType storage) const { return storage == DType::BF16 && bf16_path_ == Bf16Products::kOnednn; }
  static void check_heads(const char* kernel, int C, int NH, int NKV) {
    if (NH <= 0 || NKV <= 0 || NH % NKV != 0 || C % NH != 0)
      fail("{}: {} query heads, {} key/value heads and {} channels (need NKV | NH and NH | C)", kernel, NH, NKV, C);
  }

  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                       float eps) override {
    cpu::rmsnorm_forward(out, rstd, inp, weight, N, C, eps);
  }
  void rmsnorm_backward_input(float* dinp, const float* dout, const float* inp, const float* weight,
                              const float* rstd, int N, int C) override {
    cpu::rmsnorm_backward_input(dinp, dout, inp, weight, rstd, N, C);
  }
  void rmsnorm_backward_weight(float* dweight, const float* dout, const float* inp, const float* rstd, int N,
                               int C) override {
    cpu::rmsnorm_backward_weight(dweight, dout, inp, rstd, N, C);
  }
  void rope(float* x, int B, int T, int ld, int heads, int head_size, float theta, bool inverse, int pos0,
            const int32_t* positions) override {
    if (head_size % 2 != 0) fail("rope: head size {} is odd (channels rotate in pairs)", head_size);
    cpu::rope(x, B, T, ld, heads, head_size, theta, inverse, pos0, positions);
  }
  void gather_rows(float* out, const float* in, const int32_t* index, const float* scale, int rows, int C) override {
    cpu::gather_rows(out, in, index, scale, rows, C);
  }
  void combine_rows(float* out, const float* in, const int32_t* row, const float* weight, int N, int k,
                    int C) override {
    cpu::combine_rows(out, in, row, weight, N, k, C);
  }
  void row_dots(float* out, const float* a, const float* b, const int32_t* row, int N, int k, int C) override {
    cpu::row_dots(out, a, b, row, N, k, C);
  }
  RouteCounts moe_route(const RoutedArrays& out, const float* logits, const float* bias, int N, const RouterSpec& spec,
                        MemoryPool& /*pool*/) override {
    return route_into(out, logits, bias, N, spec);
  }
  void moe_router_backward(float* dlogits, const RoutedArrays& r, const float* logits, const float* dweight, int N,
                           const RouterSpec& spec, double scale) override {
    router_backward(r.scores, r.expert, r.chosen, logits, dweight, N, spec, scale, dlogits);
  }
  void swiglu_forward(float* out, const float* g, const float* u, size_t n) override {
    cpu::swiglu_forward(out, g, u, n);
  }
  void swiglu_backward(float* dg, float* du, const float* dout, const float* g, const float* u, size_t n) override {
    cpu::swiglu_backward(dg, du, dout, g, u, n);
  }

  void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                         int B, int T, int C) override {
    cpu::embedding_forward(out, tokens, wte, wpe, B, T, C);
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                          int B, int T, int C) override {
    cpu::embedding_backward(dwte, dwpe, dout, tokens, B, T, C);
  }

  void embedding_lookup(float* out, const int32_t* tokens, const float* wte, int row_begin,
                        int row_end, int N, int C) override {
    cpu::embedding_lookup(out, tokens, wte, row_begin, row_end, N, C);
  }
  void embedding_scatter(float* dwte, const float* dout, const int32_t* tokens, int row_begin,
                         int row_end, int N, int C) override {
    cpu::embedding_scatter(dwte, dout, tokens, row_begin, row_end, N, C);
  }
  void embedding_lookup(float* out, const int32_t* tokens, const bf16* wte, int row_begin, int row_end, int N,
                        int C) override {
    cpu::embedding_lookup(out, tokens, wte, row_begin, row_end, N, C);
  }
  void position_add(float* out, const bf16* wpe, int B, int T, int C, const int32_t* positions) override {
    cpu::position_add(out, wpe, B, T, C, positions);
  }
  void position_add(float* out, const float* wpe, int B, int T, int C, const int32_t* positions) override {
    cpu::position_add(out, wpe, B, T, C, positions);
  }
  void position_backward(float* dwpe, const float* dout, int B, int T, int C, const int32_t* positions) override {
    cpu::position_backward(dwpe, dout, B, T, C, positions);
  }

  void crossentropy_local_max(float* rowmax, const float* logits, int N, int Vl, int col_begin,
                              int V) override {
    cpu::crossentropy_local_max(rowmax, logits, N, Vl, col_begin, V);
  }
  void crossentropy_local_sums(float* sumexp, float* target_logit, const float* logits,
                               const float* rowmax, const int32_t* targets, int N, int Vl,
                               int col_begin, int V) override {
    cpu::crossentropy_local_sums(sumexp, target_logit, logits, rowmax, targets, N, Vl, col_begin,
                                 V);
  }
  void crossentropy_finish(float* losses, float* logits, const float* rowmax, const float* sumexp,
                           const float* target_logit, const int32_t* targets, int N, int Vl,
                           int col_begin, int V, float grad_scale) override {
    cpu::crossentropy_finish(losses, logits, rowmax, sumexp, target_logit, targets, N, Vl,
                             col_begin, V, grad_scale);
  }

  void crossentropy_forward(float* losses, float* logits, const int32_t* targets, int N, int V,
                            int Vp, float grad_scale) override {
    cpu::crossentropy_forward(losses, logits, targets, N, V, Vp, grad_scale);
  }

  void adamw(float* params, const float* grads, float* m, float* v, size_t n, float lr,
             float beta1, float beta2, float eps, float weight_decay, int step,
             float grad_scale) override {
    cpu::adamw(params, grads, m, v, n, lr, beta1, beta2, eps, weight_decay, step, grad_scale);
  }

 private:
  HostAllocator memory_;
  Bf16Products bf16_path_;
  std::vector<float> gemm_scratch_;  // gemm_bf16's widened operands
  std::unique_ptr<PackedDense> packed_;  // runtime.pack_weights: the held weights' copies
  std::array<ProductLibrary, 3> library_{ProductLibrary::Blas, ProductLibrary::Blas, ProductLibrary::Blas};
};

}  // namespace
}  // namespace cpu

std::unique_ptr<Backend> make_cpu_backend() { return make_cpu_backend(bf16_products()); }

std::unique_ptr<Backend> make_cpu_backend(Bf16Products bf16_path) {
  if (bf16_path == Bf16Products::kOnednn && !cpu::onednn_runs_bf16())
    fail("cpu backend: bf16 products through oneDNN asked for, but {}",
         cpu::onednn_built_in() ? "oneDNN cannot run bf16 here" : "pipetrain was built without oneDNN");
  // One product large enough to run on every BLAS thread makes the BLAS allocate its
  // work buffers (OpenBLAS: ~128 MiB per thread, on first use) at start-up: a rank short
  // of memory later would otherwise hang inside OpenBLAS, which retries a failed buffer
  // allocation forever, instead of failing cleanly in our own allocation. (~5 ms.)
  static const bool warmed = [] {
#ifdef PIPETRAIN_HAVE_OPENBLAS
    // OpenBLAS would spin here too when even these buffers do not fit: check first.
    const size_t need = static_cast<size_t>(std::max(1, openblas_get_num_threads())) * (130u << 20);
    void* probe = std::malloc(need);
    if (!probe) fail("cpu backend: out of memory at start-up: the BLAS needs {} MiB of work space", need >> 20);
    std::free(probe);
#endif
    constexpr int n = 512;
    std::vector<float> a(static_cast<size_t>(n) * n, 0.0f), c(a.size());
    cpu::gemm(false, false, n, n, n, 1.0f, a.data(), n, a.data(), n, 0.0f, c.data(), n);
    return true;
  }();
  (void)warmed;
  return std::make_unique<cpu::CpuBackend>(bf16_path);
}

std::string blas_kernel_name() {
#ifdef PIPETRAIN_HAVE_OPENBLAS
  const char* core = openblas_get_corename();
  if (core != nullptr && *core != '\0') return core;
#endif
  return "unknown";
}

void set_blas_threads(int n) {
#ifdef PIPETRAIN_HAVE_OPENBLAS
  openblas_set_num_threads(n < 1 ? 1 : n);
#endif
  set_onednn_threads(n);  // oneDNN's products (bf16) on the same share of the CPUs
}

}  // namespace pipetrain
