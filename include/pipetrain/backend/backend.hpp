// The backend interface: every kernel the model needs, on raw device pointers.
// One implementation per device (src/backend/cpu, later src/backend/cuda); the
// kernel harness in tests/ checks each against a naive reference.
//
// Conventions: fp32, row-major, contiguous unless a leading dimension is given.
// "N" is the number of rows (tokens), "C" the channel count. Functions whose
// comment says "accumulates" add into their output (+=); all others overwrite.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "pipetrain/backend/bf16_products.hpp"
#include "pipetrain/backend/gemm_problem.hpp"
#include "pipetrain/core/dense_products.hpp"
#include "pipetrain/backend/moe_routing.hpp"
#include "pipetrain/core/device_allocator.hpp"
#include "pipetrain/core/documents.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/core/memory_pool.hpp"
#include "pipetrain/core/stream.hpp"
#include "pipetrain/core/tensor.hpp"

namespace pipetrain {

// What an attention forward keeps for its backward. The CPU backend keeps the softmax
// probabilities, (B, NH, T, T), in the storage precision; the CUDA backend's flash kernels
// keep each row's log-sum-exp and the output, O(T) per row.
class AttentionStash {
 public:
  virtual ~AttentionStash() = default;
  virtual size_t bytes() const = 0;
};

class Backend : public DeviceAllocator {
 public:
  ~Backend() override = default;
  // device(): DeviceAllocator's (host for the CPU backend, cuda:N for the CUDA one).
  // The stream every kernel of this backend is enqueued on (communication orders itself
  // against it: see comm/communicator.hpp).
  virtual Stream& stream() = 0;
  virtual std::string name() const = 0;  // e.g. "cpu (Kokkos Serial, OpenBLAS Haswell)"
  // Checks of device data (token ids, targets) that would make a device backend wait for
  // its stream at every call: with defer_checks(true) they are recorded on the stream and
  // check_deferred() reports the first one that failed (the same message, with the
  // offending value), waiting once; the trainer does so once a step. The CPU checks at once.
  virtual void defer_checks(bool /*on*/) {}
  virtual void check_deferred() {}

  // ---- memory (device memory; the pool in core sits on top of these) ----
  // allocate / deallocate: DeviceAllocator (64-byte aligned; Error when out of memory).
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;  // device to device
  virtual void fill(float* x, float value, size_t n) = 0;
  // Host <-> device transfers: DeviceAllocator's to_device / to_host (plain copies on the
  // CPU backend; on CUDA ordered after the work already on stream()).

  // ---- matrix products ----
  // C = alpha * op(A) * op(B) + beta * C; op(A) is M x K, op(B) is K x N, C is M x N.
  virtual void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                    int lda, const float* B, int ldb, float beta, float* C, int ldc) = 0;
  // A dense layer's output in one call: C = op(A) * op(B) + bias + residual, where bias[N]
  // is added to every row and residual is M x N with leading dimension ldc (either may be
  // null; C must not alias them). The CPU starts C at bias + residual and accumulates the
  // product into it (sgemm's beta = 1): no zeroing pass inside the BLAS and no separate
  // bias or residual pass over C.
  virtual void gemm_bias(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B,
                         int ldb, float* C, int ldc, const float* bias, const float* residual) = 0;
  // A dense layer's two products by its weight W (out x in, row-major, as stored), over
  // `rows` rows: y = x W^T + bias + residual (as gemm_bias; either may be null) and
  // dx = dy W. While the weights are held (hold_weights) and the backend packs them
  // (set_pack_weights), it multiplies by a copy of W in its product library's own layout,
  // made at W's first product of the hold; otherwise these are gemm_bias and gemm.
  virtual void dense_forward(int rows, int out, int in, const float* x, const float* w, float* y, const float* bias,
                             const float* residual) {
    gemm_bias(false, true, rows, out, in, x, in, w, in, y, out, bias, residual);
  }
  virtual void dense_backward_input(int rows, int out, int in, const float* dy, const float* w, float* dx) {
    gemm(false, false, rows, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
  }
  // The weight gradient dW += dy^T x (dy: rows x out, x: rows x in, dW: out x in).
  virtual void dense_backward_weight(int rows, int out, int in, const float* dy, const float* x, float* dw) {
    gemm(true, false, out, in, rows, 1.0f, dy, out, x, in, 1.0f, dw, in);
  }
  // Which library runs each of the three fp32 products and which weight shapes are kept
  // packed (core/dense_products.hpp; the trainer applies plan/product_choice's choice).
  // False where this backend cannot run them so (a GPU: one library; a CPU built without
  // oneDNN). Replaces what set_pack_weights set.
  virtual bool set_dense_paths(const DensePaths& paths) { return paths == DensePaths{}; }
  // One weight shape's products at `rows` rows on each path this backend has, timed here;
  // nothing where it has only one (a GPU).
  virtual std::optional<DenseProductTimes> time_dense_products(DenseShape shape, int rows) {
    (void)shape, (void)rows;
    return std::nullopt;
  }
  // Begins (true) or ends (false) a span in which no weight changes: an executor run (the
  // optimizer updates between runs). Outside a span the products read W as it stands.
  virtual void hold_weights(bool held) { (void)held; }
  // runtime.pack_weights: keep held weights in the product library's layout, at the cost
  // of two copies of every weight a span multiplies by (the forward's and dx's layouts).
  // False where this backend cannot: CPU without oneDNN's optimized f32 matmul; CUDA.
  virtual bool set_pack_weights(bool on) { return !on; }
  // What the packed copies hold now: their elements (as multiplied, one count per copy)
  // and bytes in the library's layout (padding included).
  struct PackedWeights {
    int64_t elements = 0;
    size_t bytes = 0;
  };
  virtual PackedWeights packed_weights() const { return {}; }
  // Work for a rank that would wait (the executor, blocked on a receive): while held,
  // refreshes the packed copies the last span multiplied by and this one has not yet, in
  // the order the last span first did, until `arrived()` or none is left; how many. Their
  // first products then find them ready, off the wait's critical path.
  virtual int refresh_packed_weights_until(const std::function<bool()>& arrived) {
    (void)arrived;
    return 0;
  }
  // The weights the spans so far multiplied by may go away (their owner is being
  // destroyed): drop their copies, which a later span would otherwise refresh from them.
  virtual void forget_packed_weights() {}
  // `batch` independent gemms; matrix i starts at A + i*stride_a (etc.).
  virtual void gemm_strided_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                                    const float* A, int lda, long stride_a, const float* B, int ldb,
                                    long stride_b, float beta, float* C, int ldc, long stride_c,
                                    int batch) = 0;

  // ---- grouped products (a mixture of experts': one product per expert, each its own M) ----
  // For every problem, C = alpha * op(A) * op(B) + beta * C (as gemm), the transposes and
  // scalars shared. This default runs them in order, calling `between` after each (the
  // executor's chance to progress a paused exchange, comm/steps.hpp): the CPU's one
  // well-packed sgemm per expert. CUDA: one cuBLAS grouped call.
  virtual void gemm_grouped(bool trans_a, bool trans_b, float alpha, float beta,
                            const std::vector<GemmProblem>& problems, const std::function<void()>& between = {}) {
    for (const GemmProblem& p : problems) {
      gemm(trans_a, trans_b, p.M, p.N, p.K, alpha, p.A, p.lda, p.B, p.ldb, beta, p.C, p.ldc);
      if (between) between();
    }
  }

  // ---- bf16 matrix products (train.precision = "bf16") ----
  // C = alpha * op(A) * op(B) + beta * C with A and B in bf16, products accumulated in f32
  // and C in f32; the shapes and leading dimensions as in gemm. The epilogue (beta = 0
  // only) runs on the product before it is stored: kBias adds bias[n] to every row of C;
  // kBiasGelu also keeps the biased product in pre_gelu (M x N, leading dimension ldc)
  // and stores C = gelu(pre_gelu). CPU: oneDNN's matmul, or the operands widened to f32
  // around sgemm (the same values a bf16 product sees; bf16_products.hpp says which);
  // CUDA: cuBLASLt with its bias and GELU epilogues.
  enum class Epilogue { kNone, kBias, kBiasGelu };
  // Whether gemm_bf16 multiplies bf16 operands itself (cuBLASLt, oneDNN) rather than
  // widening them: where it widens, a layer runs the f32 product on its f32 working
  // copies instead (the weights' bf16-rounded f32 copy exists; widening them again for
  // every product would cost a pass over the weights each time).
  virtual bool bf16_products_native() const = 0;
  virtual void gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const bf16* A, int lda,
                         const bf16* B, int ldb, float beta, float* C, int ldc, Epilogue epilogue = Epilogue::kNone,
                         const float* bias = nullptr, float* pre_gelu = nullptr) = 0;

  // ---- elementwise and reductions ----
  virtual void add(float* out, const float* a, const float* b, size_t n) = 0;  // out = a + b
  virtual void accumulate(float* out, const float* a, size_t n) = 0;          // out += a
  virtual void scale(float* x, float s, size_t n) = 0;                        // x *= s
  // Precision casts (mixed precision): out = bf16(in), rounded to nearest even; out = f32(in).
  virtual void cast_to_bf16(bf16* out, const float* in, size_t n) = 0;
  virtual void cast_to_f32(float* out, const bf16* in, size_t n) = 0;
  // out = bf16(x) and x = f32(out): x rounded in place and its stored form, the way a bf16
  // activation is kept (model/precision.hpp). Two casts here; the CPU does it in one pass.
  virtual void round_to_bf16(bf16* out, float* x, size_t n) {
    cast_to_bf16(out, x, n);
    cast_to_f32(x, out, n);
  }
  virtual double sum_squares(const float* x, size_t n) = 0;  // sum of x^2 in double
  virtual bool all_finite(const float* x, size_t n) = 0;
  // out[n, c] += bias[c] for an N x C matrix.
  virtual void bias_add(float* out, const float* bias, int N, int C) = 0;
  // dbias[c] += sum_n dout[n, c]   (accumulates)
  virtual void bias_backward(float* dbias, const float* dout, int N, int C) = 0;

  // ---- GELU, tanh approximation (GPT-2) ----
  virtual void gelu_forward(float* out, const float* inp, size_t n) = 0;
  // dinp = gelu'(inp) * dout   (overwrites; dinp may alias dout)
  virtual void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) = 0;

  // ---- LayerNorm over the last dimension (C), eps given ----
  // out = (inp - mean) * rstd * weight + bias; mean[N] and rstd[N] saved for backward.
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                 const float* weight, const float* bias, int N, int C,
                                 float eps) = 0;
  // dinp += dL/dinp   (accumulates: the residual stream adds the branch gradient)
  virtual void layernorm_backward_input(float* dinp, const float* dout, const float* inp,
                                        const float* weight, const float* mean, const float* rstd,
                                        int N, int C) = 0;
  // dweight += sum_n dout * xhat; dbias += sum_n dout   (accumulates)
  virtual void layernorm_backward_weight(float* dweight, float* dbias, const float* dout,
                                         const float* inp, const float* mean, const float* rstd,
                                         int N, int C) = 0;

  // ---- causal multi-head self-attention on a fused QKV tensor, grouped-query ----
  // NH query heads of size hs = C / NH, NKV key/value heads (NKV divides NH; NKV = NH is
  // plain multi-head attention): qkv is (B, T, C + 2 NKV hs) laid out [Q | K | V]; query
  // head h uses channels h*hs .. of Q and key/value head h / (NH / NKV) of K and V.
  // out: (B, T, C), head h in channels h*hs .. (h+1)*hs-1. Scores are scaled by
  // 1/sqrt(hs). What forward keeps for backward is the backend's choice, opaque to the
  // model (its memory comes from `pool`, so it counts as stashed activations); `storage`
  // is the precision activations are stashed in (bf16: the stash may be bf16).
  // positions (B*T int32 on the device, or null): packed documents, core/documents.hpp —
  // query t sees keys [t - positions[t], t] of its sequence only. Both passes take them.
  virtual std::unique_ptr<AttentionStash> attention_forward(float* out, const float* qkv, int B, int T, int C, int NH,
                                                            int NKV, MemoryPool& pool, DType storage,
                                                            const int32_t* positions = nullptr) = 0;
  // Generation with a key/value cache: new query i (of n, at position pos + i) attends,
  // causally, to the cached keys and values [0, pos + i]. q: n rows of ldq floats, head h
  // at column h * hs; k, v: rows of ldkv floats, NKV heads (query head h reads key/value
  // head h / (NH / NKV)); out: n rows of NH * hs. Scale 1/sqrt(hs), as attention_forward.
  virtual void attention_decode(float* out, const float* q, int ldq, const float* k, const float* v, int ldkv, int n,
                                int pos, int NH, int NKV, int hs) = 0;
  // dqkv = dL/dqkv (overwrites), from the stash forward returned (workspace from `pool`).
  virtual void attention_backward(float* dqkv, const float* dout, const float* qkv, AttentionStash& stash, int B, int T,
                                  int C, int NH, int NKV, MemoryPool& pool, const int32_t* positions = nullptr) = 0;
  // Both with qkv as a bf16 run stores it. These widen it into `pool` and run the f32 forms
  // (the same values); a backend whose attention multiplies bf16 reads it as it is.
  virtual std::unique_ptr<AttentionStash> attention_forward(float* out, const bf16* qkv, int B, int T, int C, int NH,
                                                            int NKV, MemoryPool& pool, DType storage,
                                                            const int32_t* positions = nullptr) {
    const Tensor wide = widened_qkv(qkv, B, T, C, NH, NKV, pool);
    return attention_forward(out, wide.f32(), B, T, C, NH, NKV, pool, storage, positions);
  }
  virtual void attention_backward(float* dqkv, const float* dout, const bf16* qkv, AttentionStash& stash, int B, int T,
                                  int C, int NH, int NKV, MemoryPool& pool, const int32_t* positions = nullptr) {
    const Tensor wide = widened_qkv(qkv, B, T, C, NH, NKV, pool);
    attention_backward(dqkv, dout, wide.f32(), stash, B, T, C, NH, NKV, pool, positions);
  }

  // ---- attention against one block of keys, by global positions (context parallelism's
  // ring, model/ring_attention.hpp; flash style: nothing of Tq x Tk kept between passes) ----
  // B sequences of Tq queries (q: rows of ldq floats, NH heads of hs) against Tk keys and
  // values (k, v: rows of ldkv floats, NKV heads; query head h reads h / (NH / NKV)). Key j
  // of a sequence is visible to its query i iff
  //   qstart[b Tq + i] <= kpos[b Tk + j] <= qpos[b Tq + i]
  // (qstart: the global position of the query's document's first token under packed
  // documents; nullptr: 0, every earlier key). out (B Tq rows of NH hs): the visible values
  // weighted by their softmax within the block; lse (B, NH, Tq): the log-sum-exp of the
  // visible scores, -inf for a row that sees none (its out 0).
  virtual void attention_block_forward(float* out, float* lse, const float* q, int ldq, const float* k, const float* v,
                                       int ldkv, const int32_t* qpos, const int32_t* qstart, const int32_t* kpos, int B,
                                       int Tq, int Tk, int NH, int NKV, int hs, MemoryPool& pool) {
    no_block_attention(out, lse, q, ldq, k, v, ldkv, qpos, qstart, kpos, B, Tq, Tk, NH, NKV, hs, pool);
  }
  // The blocks merged: out = the lse-weighted mean of out and block_out, lse = their
  // log-sum-exp (a block_lse of -inf leaves the row as it is).
  virtual void attention_merge(float* out, float* lse, const float* block_out, const float* block_lse, int B, int T,
                               int NH, int hs) {
    no_block_attention(out, lse, block_out, block_lse, B, T, NH, hs);
  }
  // delta (B, NH, T) = the row sums of dout * out, per head (the softmax backward's term).
  virtual void attention_delta(float* delta, const float* dout, const float* out, int B, int T, int NH, int hs) {
    no_block_attention(delta, dout, out, B, T, NH, hs);
  }
  // One block's part of the merged attention's backward, with the merged lse and delta:
  // dq (rows of lddq) += the block's query gradient, dk and dv (rows of lddkv) += its keys'
  // and values' (accumulates).
  virtual void attention_block_backward(float* dq, int lddq, float* dk, float* dv, int lddkv, const float* dout,
                                        const float* delta, const float* lse, const float* q, int ldq, const float* k,
                                        const float* v, int ldkv, const int32_t* qpos, const int32_t* qstart,
                                        const int32_t* kpos, int B, int Tq, int Tk, int NH, int NKV, int hs,
                                        MemoryPool& pool) {
    no_block_attention(dq, lddq, dk, dv, lddkv, dout, delta, lse, q, ldq, k, v, ldkv, qpos, qstart, kpos, B, Tq, Tk, NH,
                       NKV, hs, pool);
  }

  // ---- Llama: RMSNorm, rotary embeddings, SwiGLU ----
  // out = inp * rstd * weight with rstd[n] = 1 / sqrt(mean_c inp[n, c]^2 + eps) (saved).
  virtual void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                               float eps) = 0;
  // dinp += dL/dinp   (accumulates: the residual stream adds the branch gradient)
  virtual void rmsnorm_backward_input(float* dinp, const float* dout, const float* inp, const float* weight,
                                      const float* rstd, int N, int C) = 0;
  // dweight += sum_n dout * inp * rstd   (accumulates)
  virtual void rmsnorm_backward_weight(float* dweight, const float* dout, const float* inp, const float* rstd,
                                       int N, int C) = 0;
  // In place on B*T rows of leading dimension ld (row b*T + t is position t): the first
  // heads * head_size channels, head by head, have their channel pairs (2i, 2i+1)
  // rotated by t * theta^(-2i / head_size) (Meta's Llama convention); inverse rotates
  // back (the backward of the rotation).
  // pos0: the position of row t = 0 (generation's cached prefix; 0 in training).
  // positions (B*T int32 on the device, or null): row b*T + t is at positions[b*T + t]
  // instead (packed documents, core/documents.hpp).
  virtual void rope(float* x, int B, int T, int ld, int heads, int head_size, float theta, bool inverse, int pos0 = 0,
                    const int32_t* positions = nullptr) = 0;
  // out = silu(g) * u elementwise; backward: dg = dout u silu'(g), du = dout silu(g)
  // (overwrite; dg or du may alias dout).
  virtual void swiglu_forward(float* out, const float* g, const float* u, size_t n) = 0;
  virtual void swiglu_backward(float* dg, float* du, const float* dout, const float* g, const float* u,
                               size_t n) = 0;

  // ---- mixture-of-experts rows (model/moe_mlp.hpp): each output row written by one work
  // item, its terms summed in a fixed order (no atomics: deterministic) ----
  // out[i, :] = scale[i] * in[index[i], :] for i < rows (scale null: 1).
  virtual void gather_rows(float* out, const float* in, const int32_t* index, const float* scale, int rows, int C) = 0;
  // out[t, :] += sum over j < k, in order, of weight[row[t k + j]] * in[row[t k + j], :] (weight null: 1);
  // a row < 0 (a choice dropped over an expert's capacity) adds nothing.
  virtual void combine_rows(float* out, const float* in, const int32_t* row, const float* weight, int N, int k,
                            int C) = 0;
  // out[t k + j] = a[t, :] . b[row[t k + j], :]  (overwrites; 0 where the row is < 0)
  virtual void row_dots(float* out, const float* a, const float* b, const int32_t* row, int N, int k, int C) = 0;
  // The router (backend/moe_routing.hpp): from its logits (N, E) and the selection bias
  // (E, or null), both here, the arrays of `out` (here) and, on the host, the counts and
  // losses. CPU: route_into; CUDA: on the device, only the counts and losses copied back.
  virtual RouteCounts moe_route(const RoutedArrays& out, const float* logits, const float* bias, int N,
                                const RouterSpec& spec, MemoryPool& pool) = 0;
  // dlogits (N, E) from the combine weights' gradient dweight (N, k) and the routing `r`
  // (backend/moe_routing.hpp: router_backward).
  virtual void moe_router_backward(float* dlogits, const RoutedArrays& r, const float* logits, const float* dweight,
                                   int N, const RouterSpec& spec, double scale) = 0;

  // ---- token + position embedding ----
  // out[b, t, :] = wte[tokens[b*T + t], :] + wpe[t, :]
  virtual void embedding_forward(float* out, const int32_t* tokens, const float* wte,
                                 const float* wpe, int B, int T, int C) = 0;
  // dwte[tokens[b,t], :] += dout[b, t, :]; dwpe[t, :] += dout[b, t, :]   (accumulates)
  virtual void embedding_backward(float* dwte, float* dwpe, const float* dout,
                                  const int32_t* tokens, int B, int T, int C) = 0;

  // ---- vocabulary-sharded embedding (tensor parallel) ----
  // This rank holds rows [row_begin, row_end) of the padded token embedding.
  // out[n, :] = wte[tokens[n] - row_begin, :] if row_begin <= tokens[n] < row_end, else 0.
  virtual void embedding_lookup(float* out, const int32_t* tokens, const float* wte, int row_begin,
                                int row_end, int N, int C) = 0;
  // The same from a bf16 table (bf16 runs' rounded weights), each value widened exactly.
  virtual void embedding_lookup(float* out, const int32_t* tokens, const bf16* wte, int row_begin,
                                int row_end, int N, int C) = 0;
  // dwte[tokens[n] - row_begin, :] += dout[n, :] for the tokens in range   (accumulates)
  virtual void embedding_scatter(float* dwte, const float* dout, const int32_t* tokens,
                                 int row_begin, int row_end, int N, int C) = 0;
  // out[b, t, :] += wpe[p, :] with p = t, or positions[b*T + t] where given (packed
  // documents, core/documents.hpp: B*T int32 on the device)
  virtual void position_add(float* out, const float* wpe, int B, int T, int C, const int32_t* positions = nullptr) = 0;
  virtual void position_add(float* out, const bf16* wpe, int B, int T, int C, const int32_t* positions = nullptr) = 0;
  // dwpe[p, :] += the dout[b, t, :] at position p   (accumulates)
  virtual void position_backward(float* dwpe, const float* dout, int B, int T, int C,
                                 const int32_t* positions = nullptr) = 0;

  // ---- vocabulary-parallel cross-entropy (tensor parallel) ----
  // This rank holds logit columns [col_begin, col_begin + Vl) of the padded vocabulary
  // (row stride Vl); global columns >= V are padding and never take part. Three phases,
  // with all-reduces over the tensor-parallel ranks in between:
  // 1. rowmax[n] = max over this rank's real columns (-inf if it has none).
  virtual void crossentropy_local_max(float* rowmax, const float* logits, int N, int Vl,
                                      int col_begin, int V) = 0;
  // 2. With the global rowmax: sumexp[n] = sum over real local columns of
  //    exp(logit - rowmax[n]); target_logit[n] = logits[n, targets[n] - col_begin] if the
  //    target is one of this rank's columns, else 0. A target outside [0, V) throws, except
  //    kIgnoredTarget (core/documents.hpp), which takes part nowhere: its loss and gradient are 0.
  virtual void crossentropy_local_sums(float* sumexp, float* target_logit, const float* logits,
                                       const float* rowmax, const int32_t* targets, int N, int Vl,
                                       int col_begin, int V) = 0;
  // 3. With the global sums: losses[n] = log(sumexp[n]) + rowmax[n] - target_logit[n]; if
  //    grad_scale != 0, logits is overwritten with grad_scale * (softmax - onehot) on the real
  //    local columns and 0 on padding; an ignored target's loss and gradient row are 0.
  virtual void crossentropy_finish(float* losses, float* logits, const float* rowmax,
                                   const float* sumexp, const float* target_logit,
                                   const int32_t* targets, int N, int Vl, int col_begin, int V,
                                   float grad_scale) = 0;

  // ---- softmax cross-entropy over a padded vocabulary ----
  // logits: N x Vp; only the first V columns are real (padded columns are excluded from the
  // softmax). losses[n] = -log softmax(logits[n, :V])[targets[n]]; 0, with a 0 gradient row,
  // for a target of kIgnoredTarget (core/documents.hpp).
  // If grad_scale != 0, logits is overwritten with dL/dlogits = grad_scale * (softmax - onehot)
  // for the real columns and 0 for the padded ones (the fused classifier of llm.c).
  virtual void crossentropy_forward(float* losses, float* logits, const int32_t* targets, int N,
                                    int V, int Vp, float grad_scale) = 0;

  // ---- AdamW, bias-corrected, decoupled weight decay ----
  // For each i: g = grads[i] * grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
  // mhat = m / (1 - b1^step); vhat = v / (1 - b2^step);
  // param -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * param).   step starts at 1.
  virtual void adamw(float* params, const float* grads, float* m, float* v, size_t n, float lr,
                     float beta1, float beta2, float eps, float weight_decay, int step,
                     float grad_scale) = 0;

 protected:
  // A qkv row's width: C query channels and NKV key and value heads of C / NH channels each.
  static int qkv_width(int C, int NH, int NKV) { return C + 2 * NKV * (C / NH); }

 private:
  // The block-attention forms' default: refused with the backend's name (each argument named
  // above is taken, so none goes unused).
  template <typename... Args>
  [[noreturn]] void no_block_attention(const Args&...) const {
    fail(
        "{}: attention against a block of keys (context parallelism's ring) runs on the CPU and CUDA backends "
        "only in this version",
        name());
  }
  Tensor widened_qkv(const bf16* qkv, int B, int T, int C, int NH, int NKV, MemoryPool& pool) {
    if (NH <= 0 || NKV <= 0 || C % NH != 0) fail("attention: {} query heads, {} key/value heads, {} channels", NH, NKV, C);
    const int64_t n = static_cast<int64_t>(B) * T * qkv_width(C, NH, NKV);
    Tensor wide = Tensor::empty(pool, {n});
    cast_to_f32(wide.f32(), qkv, static_cast<size_t>(n));
    return wide;
  }
};

// The CPU backend (Kokkos host execution space + BLAS). Kokkos must be initialised
// (see KokkosSession in core/runtime_env.hpp) before any kernel runs. Its bf16 products
// take the process's path (bf16_products.hpp), or the one named (the kernel tests run both).
std::unique_ptr<Backend> make_cpu_backend();
std::unique_ptr<Backend> make_cpu_backend(Bf16Products bf16_path);

// Name of the BLAS kernel in use (OpenBLAS core name), or "unknown".
// Holds the weights still for a scope (Backend::hold_weights), released however it ends.
class HeldWeights {
 public:
  explicit HeldWeights(Backend& backend) : backend_(backend) { backend_.hold_weights(true); }
  ~HeldWeights() { backend_.hold_weights(false); }
  HeldWeights(const HeldWeights&) = delete;
  HeldWeights& operator=(const HeldWeights&) = delete;

 private:
  Backend& backend_;
};

std::string blas_kernel_name();
// Products a CPU backend ran in this process by a weight kept in oneDNN's layout
// (runtime.pack_weights): how a test or benchmark sees that packing took place.
long packed_dense_products_run();
// Products a CPU backend ran in this process through oneDNN's sgemm (runtime.dense_products).
long onednn_sgemm_products_run();
// Restricts BLAS (and oneDNN, when built in) to `n` threads (no-op where the BLAS cannot be told).
void set_blas_threads(int n);

}  // namespace pipetrain
