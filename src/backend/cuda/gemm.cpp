// Matrix products on the GPU with cuBLAS. The interface is row-major and cuBLAS
// column-major: a row-major X with leading dimension ld is the column-major X^T,
// so C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T, i.e. cuBLAS gets
// (B, A) swapped with (N, M) and the same transpose flags. K = 0 means C = beta C
// (handled here: cuBLAS's leading-dimension checks would trip on it).
// Math mode (pure fp32 or TF32) is set on the handle by the backend.
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
