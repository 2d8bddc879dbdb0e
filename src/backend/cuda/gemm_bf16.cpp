// bf16 products on the GPU with cuBLASLt: bf16 operands, f32 accumulation (compute type
// 32F) and f32 output, with cuBLASLt's bias and GELU-with-auxiliary epilogues. Row-major
// to column-major as in gemm.cpp: C^T = op(B)^T op(A)^T, so the operands are swapped and
// cuBLASLt's bias (one value per row of its column-major D) is one per column of C.
//
// Each distinct product (shapes, transposes, leading dimensions, epilogue, the operands'
// alignments) gets its descriptors and the heuristic's algorithm once, cached per thread;
// a call then sets the pointers and runs. Where cuBLASLt cannot run the GELU epilogue (its
// auxiliary output needs a leading dimension that is a multiple of 8) or has no algorithm
// for an epilogue, the product runs plain and matrix_epilogue adds the bias and the GELU.
#include <cublasLt.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <memory>

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

// The largest power of two (at most 256, cuBLASLt's default assumption) dividing an address.
uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

// What one product needs from cuBLASLt, fixed by its key.
struct LtPlan {
  Owned<cublasLtMatmulDesc_t> op{cublas().cublasLtMatmulDescDestroy};
  Owned<cublasLtMatrixLayout_t> la{cublas().cublasLtMatrixLayoutDestroy}, lb{la.destroy}, lc{la.destroy};
  cublasLtMatmulAlgo_t algo{};
  bool found = false;  // the heuristic returned an algorithm
};

struct Product {
  bool trans_a, trans_b;
  int M, N, K, lda, ldb, ldc;
  int epilogue;                        // 0 none, 1 bias, 2 GELU with auxiliary output and bias
  uint32_t align_a, align_b, align_c;  // of A, B, C (and the auxiliary output, for GELU)
  std::array<int64_t, 12> key(cublasLtHandle_t lt) const {
    return {reinterpret_cast<int64_t>(lt),
            trans_a,
            trans_b,
            M,
            N,
            K,
            lda,
            ldb,
            ldc,
            epilogue,
            int64_t{align_a} << 20 | int64_t{align_b} << 10,
            align_c};
  }
};

std::unique_ptr<LtPlan> make_plan(const Ctx& ctx, const Product& p) {
  auto plan = std::make_unique<LtPlan>();
  PIPETRAIN_CUBLAS_CHECK(cublas().cublasLtMatmulDescCreate(&plan->op.h, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set(plan->op.h, CUBLASLT_MATMUL_DESC_TRANSA, p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
  set(plan->op.h, CUBLASLT_MATMUL_DESC_TRANSB, p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
  const cublasLtEpilogue_t ep = p.epilogue == 1   ? CUBLASLT_EPILOGUE_BIAS
                                : p.epilogue == 2 ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                                  : CUBLASLT_EPILOGUE_DEFAULT;
  set(plan->op.h, CUBLASLT_MATMUL_DESC_EPILOGUE, ep);
  if (p.epilogue == 2) set(plan->op.h, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, static_cast<int64_t>(p.ldc));
  // Column-major views: the first operand is row-major B, the second row-major A.
  PIPETRAIN_CUBLAS_CHECK(cublas().cublasLtMatrixLayoutCreate(&plan->la.h, CUDA_R_16BF, p.trans_b ? p.K : p.N,
                                                             p.trans_b ? p.N : p.K, p.ldb));
  PIPETRAIN_CUBLAS_CHECK(cublas().cublasLtMatrixLayoutCreate(&plan->lb.h, CUDA_R_16BF, p.trans_a ? p.M : p.K,
                                                             p.trans_a ? p.K : p.M, p.lda));
  PIPETRAIN_CUBLAS_CHECK(cublas().cublasLtMatrixLayoutCreate(&plan->lc.h, CUDA_R_32F, p.N, p.M, p.ldc));
  Owned<cublasLtMatmulPreference_t> pref{cublas().cublasLtMatmulPreferenceDestroy};
  PIPETRAIN_CUBLAS_CHECK(cublas().cublasLtMatmulPreferenceCreate(&pref.h));
  auto prefer = [&](cublasLtMatmulPreferenceAttributes_t attr, auto value) {
    PIPETRAIN_CUBLAS_CHECK(cublas().cublasLtMatmulPreferenceSetAttribute(pref.h, attr, &value, sizeof value));
  };
  prefer(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t{kLtWorkspaceBytes});
  // The real alignments (pool blocks are 64-byte aligned, bf16 parameter views 32-byte), so
  // the heuristic offers no algorithm that needs more. cuBLASLt's A is our B (swapped).
  prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, p.align_b);
  prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, p.align_a);
  prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, p.align_c);
  prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, p.align_c);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = cublas().cublasLtMatmulAlgoGetHeuristic(ctx.lt, plan->op.h, plan->la.h, plan->lb.h,
                                                                    plan->lc.h, plan->lc.h, pref.h, 1, &result, &found);
  if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED)
    cublas_fail("cublasLtMatmulAlgoGetHeuristic", st);
  plan->found = st == CUBLAS_STATUS_SUCCESS && found > 0;
  plan->algo = result.algo;
  return plan;
}

const LtPlan& plan_for(const Ctx& ctx, const Product& p) {
  thread_local std::map<std::array<int64_t, 12>, std::unique_ptr<LtPlan>> plans;
  auto& slot = plans[p.key(ctx.lt)];
  if (!slot) slot = make_plan(ctx, p);
  return *slot;
}

// Runs the product with its epilogue; false when cuBLASLt has no algorithm for it.
bool lt_matmul(const Ctx& ctx, const Product& p, float alpha, const __nv_bfloat16* A, const __nv_bfloat16* B,
               float beta, float* C, const float* bias, float* pre_gelu) {
  const LtPlan& plan = plan_for(ctx, p);
  if (!plan.found) return false;
  if (p.epilogue != 0) set(plan.op.h, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(bias));
  if (p.epilogue == 2) set(plan.op.h, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<void*>(pre_gelu));
  PIPETRAIN_CUBLAS_CHECK(cublas().cublasLtMatmul(ctx.lt, plan.op.h, &alpha, B, plan.la.h, A, plan.lb.h, &beta, C,
                                                 plan.lc.h, C, plan.lc.h, &plan.algo, ctx.lt_workspace,
                                                 kLtWorkspaceBytes, ctx.stream));
  return true;
}

}  // namespace

void gemm_bf16(const Ctx& ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const __nv_bfloat16* A,
               int lda, const __nv_bfloat16* B, int ldb, float beta, float* C, int ldc, int epilogue,
               const float* bias, float* pre_gelu) {
  if (M <= 0 || N <= 0) return;
  float* keep = epilogue == 2 ? pre_gelu : nullptr;
  if (K <= 0) {  // no product: beta C, then the epilogue, as on the CPU
    scale_matrix(ctx, C, M, N, ldc, beta);
    if (epilogue != 0) matrix_epilogue(ctx, C, M, N, ldc, bias, keep);
    return;
  }
  const bool lt_gelu = epilogue == 2 && ldc % 8 == 0 && alignment(pre_gelu) >= 16;
  Product p{trans_a,
            trans_b,
            M,
            N,
            K,
            lda,
            ldb,
            ldc,
            epilogue == 2 && !lt_gelu ? 1 : epilogue,
            alignment(A),
            alignment(B),
            std::min(alignment(C), epilogue == 2 ? alignment(pre_gelu) : 256u)};
  if (lt_matmul(ctx, p, alpha, A, B, beta, C, bias, pre_gelu)) {
    if (epilogue == 2 && !lt_gelu) matrix_epilogue(ctx, C, M, N, ldc, nullptr, pre_gelu);  // the bias is in
    return;
  }
  const int asked = p.epilogue;
  p.epilogue = 0;  // no algorithm with the epilogue: the plain product, then ours
  if (asked == 0 || !lt_matmul(ctx, p, alpha, A, B, beta, C, nullptr, nullptr))
    cublas_fail("cublasLtMatmulAlgoGetHeuristic (no algorithm for this bf16 product)", CUBLAS_STATUS_NOT_SUPPORTED);
  if (epilogue != 0) matrix_epilogue(ctx, C, M, N, ldc, bias, keep);
}

}  // namespace pipetrain::cuda
