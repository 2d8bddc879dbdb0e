// bf16 products on the CPU (pipetrain/backend/bf16_products.hpp says which path). Through
// oneDNN's matmul where it runs bf16 natively; else, since Debian's OpenBLAS has no bf16
// gemm, the operands are widened to f32 (exactly: every bf16 is an f32) and multiplied by
// sgemm: the products and sums a bf16 product with f32 accumulation computes, in sgemm's
// summation order.
#include <cstring>
#include <stdexcept>

#include "cpu_kernels.hpp"
#include "pipetrain/core/error.hpp"

namespace pipetrain::cpu {

namespace {

// Elements of a row-major rows x cols matrix with leading dimension ld, up to its last one.
size_t span(int rows, int cols, int ld) {
  return rows <= 0 || cols <= 0 ? 0 : static_cast<size_t>(rows - 1) * static_cast<size_t>(ld) + static_cast<size_t>(cols);
}

// C = gelu(pre_gelu) over the M x N block of rows ldc apart.
void gelu_rows(float* C, const float* pre_gelu, int M, int N, int ldc) {
  if (ldc == N) {
    gelu_forward(C, pre_gelu, static_cast<size_t>(M) * static_cast<size_t>(N));
    return;
  }
  for (int i = 0; i < M; ++i)
    gelu_forward(C + static_cast<size_t>(i) * ldc, pre_gelu + static_cast<size_t>(i) * ldc, static_cast<size_t>(N));
}

}  // namespace

void gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const bf16* A, int lda, const bf16* B,
               int ldb, float beta, float* C, int ldc, Backend::Epilogue epilogue, const float* bias, float* pre_gelu,
               std::vector<float>& scratch, Bf16Products path) {
  using E = Backend::Epilogue;
  if (epilogue != E::kNone && (beta != 0.0f || !bias || (epilogue == E::kBiasGelu && !pre_gelu)))
    fail("gemm_bf16: a bias epilogue needs beta = 0 and a bias (and pre_gelu for GELU)");
  if (M <= 0 || N <= 0) return;
  float* out = epilogue == E::kBiasGelu ? pre_gelu : C;
  if (path == Bf16Products::kOnednn &&
      gemm_bf16_onednn(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, out, ldc,
                       epilogue == E::kNone ? nullptr : bias)) {
    if (epilogue == E::kBiasGelu) gelu_rows(C, pre_gelu, M, N, ldc);
    return;
  }
  const size_t na = trans_a ? span(K, M, lda) : span(M, K, lda);
  const size_t nb = trans_b ? span(N, K, ldb) : span(K, N, ldb);
  if (scratch.size() < na + nb) scratch.resize(na + nb);
  float* a = scratch.data();
  float* b = scratch.data() + na;
  cast_to_f32(a, A, na);
  cast_to_f32(b, B, nb);
  if (epilogue == E::kBiasGelu)  // the product lands in pre_gelu; C gets gelu of it
    for (int i = 0; i < M; ++i) std::memset(out + static_cast<size_t>(i) * ldc, 0, sizeof(float) * static_cast<size_t>(N));
  gemm(trans_a, trans_b, M, N, K, alpha, a, lda, b, ldb, beta, out, ldc);
  if (epilogue == E::kNone) return;
  for (int i = 0; i < M; ++i) {
    float* row = out + static_cast<size_t>(i) * ldc;
    for (int j = 0; j < N; ++j) row[j] += bias[j];
  }
  if (epilogue == E::kBiasGelu) gelu_rows(C, pre_gelu, M, N, ldc);
}

}  // namespace pipetrain::cpu
