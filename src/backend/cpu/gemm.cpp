// Matrix products on the CPU: row-major CBLAS sgemm, a dense layer's output with its
// bias and residual (gemm_bias), and a strided batch as a loop over sgemm.
#include <cblas.h>

#include "cpu_kernels.hpp"

namespace pipetrain::cpu {

namespace {
PIPETRAIN_SIMD_CLONES
void start_row(float* c, const float* bias, const float* residual, int n) {
  if (!residual) {
    for (int j = 0; j < n; ++j) c[j] = bias[j];
  } else if (!bias) {
    for (int j = 0; j < n; ++j) c[j] = residual[j];
  } else {
    for (int j = 0; j < n; ++j) c[j] = bias[j] + residual[j];
  }
}
}  // namespace

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

void start_rows(float* C, int M, int N, int ldc, const float* bias, const float* residual) {
  Kokkos::parallel_for("pipetrain::gemm_bias_start", HostRange(0, M > 0 ? M : 0), [=](const int64_t i) {
    start_row(C + i * ldc, bias, residual ? residual + i * ldc : nullptr, N);
  });
}

// sgemm with beta = 0 first zeroes C in a pass of its own (OpenBLAS's sgemm_beta), and
// a bias or residual added afterwards is one more pass over C each: C is instead started
// at bias + residual (one pass, written once) and the product accumulated into it.
void gemm_bias(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
               float* C, int ldc, const float* bias, const float* residual, ProductLibrary library) {
  if (!bias && !residual) {
    gemm_in(library, trans_a, trans_b, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc);
    return;
  }
  start_rows(C, M, N, ldc, bias, residual);
  gemm_in(library, trans_a, trans_b, M, N, K, 1.0f, A, lda, B, ldb, 1.0f, C, ldc);
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
