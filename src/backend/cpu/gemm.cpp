// Matrix products on the CPU: row-major CBLAS sgemm, and a strided batch as a
// loop over it.
#include <cblas.h>

#include "cpu_kernels.hpp"

namespace pipetrain::cpu {

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    // C = beta * C (BLAS would do the same; handled here so lda/ldb checks cannot trip).
    for (int i = 0; i < M; ++i) {
      float* c = C + static_cast<long>(i) * ldc;
      for (int j = 0; j < N; ++j) c[j] = beta == 0.0f ? 0.0f : beta * c[j];
    }
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_strided_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                          const float* A, int lda, long stride_a, const float* B, int ldb,
                          long stride_b, float beta, float* C, int ldc, long stride_c, int batch) {
  for (int i = 0; i < batch; ++i) {
    gemm(trans_a, trans_b, M, N, K, alpha, A + i * stride_a, lda, B + i * stride_b, ldb, beta,
         C + i * stride_c, ldc);
  }
}

}  // namespace pipetrain::cpu
