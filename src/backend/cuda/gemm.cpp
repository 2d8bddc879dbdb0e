// Matrix products on the GPU with cuBLAS. The interface is row-major and cuBLAS
// column-major: a row-major X with leading dimension ld is the column-major X^T,
// so C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T, i.e. cuBLAS gets
// (B, A) swapped with (N, M) and the same transpose flags. K = 0 means C = beta C
// (handled here: cuBLAS's leading-dimension checks would trip on it).
// Math mode (pure fp32 or TF32) is set on the handle by the backend.
#include <vector>

#include "cuda_kernels.hpp"

namespace pipetrain::cuda {

void gemm(const Ctx& ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
          const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    scale_matrix(ctx, C, M, N, ldc, beta);
    return;
  }
  PIPETRAIN_CUBLAS_CHECK(cublas().cublasSgemm(ctx.blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                              trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, ldb, A, lda,
                                              &beta, C, ldc));
}

#if CUBLAS_VER_MAJOR > 12 || (CUBLAS_VER_MAJOR == 12 && CUBLAS_VER_MINOR >= 5)
namespace {

// One cuBLAS grouped call, a group per problem (cuBLAS groups share shapes); the pointer
// arrays go to the device through the scratch buffer (in stream order, like every use of it).
void grouped_call(const Ctx& ctx, bool trans_a, bool trans_b, float alpha, float beta,
                  const std::vector<GemmProblem>& problems) {
  std::vector<cublasOperation_t> ta, tb;
  std::vector<int> m, n, k, lda, ldb, ldc;
  std::vector<const void*> a, b;
  std::vector<void*> c;
  for (const GemmProblem& p : problems) {
    if (p.M <= 0 || p.N <= 0) continue;
    if (p.K <= 0) {  // C = beta C, as gemm does
      scale_matrix(ctx, p.C, p.M, p.N, p.ldc, beta);
      continue;
    }
    ta.push_back(trans_b ? CUBLAS_OP_T : CUBLAS_OP_N), tb.push_back(trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
    m.push_back(p.N), n.push_back(p.M), k.push_back(p.K);  // swapped: row-major to column-major, as gemm
    a.push_back(p.B), lda.push_back(p.ldb), b.push_back(p.A), ldb.push_back(p.lda);
    c.push_back(p.C), ldc.push_back(p.ldc);
  }
  const size_t count = m.size();
  if (count == 0) return;
  std::vector<const void*> pointers(a);
  pointers.insert(pointers.end(), b.begin(), b.end());
  pointers.insert(pointers.end(), c.begin(), c.end());
  auto** device = static_cast<void**>(ctx.scratch);
  PIPETRAIN_CUDA_CHECK(
      cudaMemcpyAsync(device, pointers.data(), pointers.size() * sizeof(void*), cudaMemcpyHostToDevice, ctx.stream));
  const std::vector<float> alphas(count, alpha), betas(count, beta);
  const std::vector<int> sizes(count, 1);
  PIPETRAIN_CUBLAS_CHECK(cublas().cublasSgemmGroupedBatched(
      ctx.blas, ta.data(), tb.data(), m.data(), n.data(), k.data(), alphas.data(),
      reinterpret_cast<const float* const*>(device), lda.data(), reinterpret_cast<const float* const*>(device + count),
      ldb.data(), betas.data(), reinterpret_cast<float* const*>(device + 2 * count), ldc.data(),
      static_cast<int>(count), sizes.data()));
}

}  // namespace
#endif

void gemm_grouped(const Ctx& ctx, bool trans_a, bool trans_b, float alpha, float beta,
                  const std::vector<GemmProblem>& problems) {
#if CUBLAS_VER_MAJOR > 12 || (CUBLAS_VER_MAJOR == 12 && CUBLAS_VER_MINOR >= 5)
  if (cublas().cublasSgemmGroupedBatched && 3 * problems.size() * sizeof(void*) <= kScratchBytes)
    return grouped_call(ctx, trans_a, trans_b, alpha, beta, problems);
#endif
  // One at a time: a cuBLAS without grouped products (before 12.5), or more pointers than
  // the scratch buffer holds.
  for (const GemmProblem& p : problems)
    gemm(ctx, trans_a, trans_b, p.M, p.N, p.K, alpha, p.A, p.lda, p.B, p.ldb, beta, p.C, p.ldc);
}

void gemm_strided_batched(const Ctx& ctx, bool trans_a, bool trans_b, int M, int N, int K,
                          float alpha, const float* A, int lda, long stride_a, const float* B,
                          int ldb, long stride_b, float beta, float* C, int ldc, long stride_c,
                          int batch) {
  if (M <= 0 || N <= 0 || batch <= 0) return;
  if (K <= 0) {
    for (int i = 0; i < batch; ++i) scale_matrix(ctx, C + i * stride_c, M, N, ldc, beta);
    return;
  }
  PIPETRAIN_CUBLAS_CHECK(cublas().cublasSgemmStridedBatched(
      ctx.blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, ldb,
      stride_b, A, lda, stride_a, &beta, C, ldc, stride_c, batch));
}

}  // namespace pipetrain::cuda
