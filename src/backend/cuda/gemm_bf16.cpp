// bf16 products on the GPU with cuBLASLt: bf16 operands, f32 accumulation (compute type
// 32F) and f32 output, with cuBLASLt's bias and GELU-with-auxiliary epilogues. Row-major
// to column-major as in gemm.cpp: C^T = op(B)^T op(A)^T, so the operands are swapped and
// cuBLASLt's bias (one value per row of its column-major D) is one per column of C.
#include <cublasLt.h>

#include <cstdint>

#include "cuda_kernels.hpp"

namespace pipetrain::cuda {

namespace {

// Owns one cuBLASLt descriptor (destroyed however the call ends).
template <class T>
struct Owned {
  explicit Owned(cublasStatus_t (*d)(T)) : destroy(d) {}
  Owned(const Owned&) = delete;
  cublasStatus_t (*destroy)(T);
  T h = nullptr;
  ~Owned() {
    if (h) (void)destroy(h);
  }
};

template <class T>
void set(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& value) {
  PIPETRAIN_CUBLAS_CHECK(cublas().cublasLtMatmulDescSetAttribute(d, attr, &value, sizeof value));
}

}  // namespace

void gemm_bf16(const Ctx& ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const __nv_bfloat16* A,
               int lda, const __nv_bfloat16* B, int ldb, float beta, float* C, int ldc, int epilogue,
               const float* bias, float* pre_gelu) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    scale_matrix(ctx, C, M, N, ldc, beta);
    return;
  }
  Owned<cublasLtMatmulDesc_t> op{cublas().cublasLtMatmulDescDestroy};
  PIPETRAIN_CUBLAS_CHECK(cublas().cublasLtMatmulDescCreate(&op.h, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, tb = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  set(op.h, CUBLASLT_MATMUL_DESC_TRANSA, ta);
  set(op.h, CUBLASLT_MATMUL_DESC_TRANSB, tb);
  cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_DEFAULT;
  if (epilogue == 1) ep = CUBLASLT_EPILOGUE_BIAS;
  if (epilogue == 2) ep = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  set(op.h, CUBLASLT_MATMUL_DESC_EPILOGUE, ep);
  if (epilogue != 0) set(op.h, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(bias));
  if (epilogue == 2) {
    set(op.h, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<void*>(pre_gelu));
    set(op.h, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, static_cast<int64_t>(ldc));
  }
  // Column-major views: the first operand is row-major B, the second row-major A.
  Owned<cublasLtMatrixLayout_t> la{cublas().cublasLtMatrixLayoutDestroy}, lb{la.destroy}, lc{la.destroy};
  PIPETRAIN_CUBLAS_CHECK(
      cublas().cublasLtMatrixLayoutCreate(&la.h, CUDA_R_16BF, trans_b ? K : N, trans_b ? N : K, ldb));
  PIPETRAIN_CUBLAS_CHECK(
      cublas().cublasLtMatrixLayoutCreate(&lb.h, CUDA_R_16BF, trans_a ? M : K, trans_a ? K : M, lda));
  PIPETRAIN_CUBLAS_CHECK(cublas().cublasLtMatrixLayoutCreate(&lc.h, CUDA_R_32F, N, M, ldc));
  Owned<cublasLtMatmulPreference_t> pref{cublas().cublasLtMatmulPreferenceDestroy};
  PIPETRAIN_CUBLAS_CHECK(cublas().cublasLtMatmulPreferenceCreate(&pref.h));
  const uint64_t workspace = kLtWorkspaceBytes;
  PIPETRAIN_CUBLAS_CHECK(cublas().cublasLtMatmulPreferenceSetAttribute(pref.h, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                                       &workspace, sizeof workspace));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  PIPETRAIN_CUBLAS_CHECK(
      cublas().cublasLtMatmulAlgoGetHeuristic(ctx.lt, op.h, la.h, lb.h, lc.h, lc.h, pref.h, 1, &result, &found));
  if (found == 0) cublas_fail("cublasLtMatmulAlgoGetHeuristic (no algorithm for this bf16 product)", CUBLAS_STATUS_NOT_SUPPORTED);
  PIPETRAIN_CUBLAS_CHECK(cublas().cublasLtMatmul(ctx.lt, op.h, &alpha, B, la.h, A, lb.h, &beta, C, lc.h, C, lc.h,
                                                 &result.algo, ctx.lt_workspace, kLtWorkspaceBytes, ctx.stream));
}

}  // namespace pipetrain::cuda
