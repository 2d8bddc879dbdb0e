// fp32 products through oneDNN's sgemm (dnnl_sgemm: row-major, BLAS arguments), the
// dense layers' other library (core/dense_products.hpp). oneDNN detects the CPU's
// instruction set by itself, so it runs its AVX-512 kernels where an OpenBLAS pinned to
// an older core (OPENBLAS_CORETYPE) would not.
#include "cpu_kernels.hpp"

#include <atomic>

#ifdef PIPETRAIN_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>

#include "pipetrain/core/error.hpp"
#endif

namespace pipetrain {

namespace {
std::atomic<long> sgemm_products{0};
}  // namespace

long onednn_sgemm_products_run() { return sgemm_products.load(std::memory_order_relaxed); }

namespace cpu {

bool gemm_onednn(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
                 int ldb, float beta, float* C, int ldc) {
#ifdef PIPETRAIN_HAVE_ONEDNN
  if (M <= 0 || N <= 0) return true;
  if (K <= 0) {  // as gemm: C = beta C (oneDNN would refuse lda < 1)
    gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return true;
  }
  const dnnl_status_t s =
      dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  if (s != dnnl_success)
    fail("oneDNN sgemm {}x{}x{} ({}{}, lda {} ldb {} ldc {}): status {}", M, N, K, trans_a ? 'T' : 'N',
         trans_b ? 'T' : 'N', lda, ldb, ldc, static_cast<int>(s));
  sgemm_products.fetch_add(1, std::memory_order_relaxed);
  return true;
#else
  (void)trans_a, (void)trans_b, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B, (void)ldb,
      (void)beta, (void)C, (void)ldc;
  return false;
#endif
}

void gemm_in(ProductLibrary library, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
             int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  if (library == ProductLibrary::Onednn && gemm_onednn(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc))
    return;
  gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace cpu
}  // namespace pipetrain
