// GemmProblem: one product of a grouped call (Backend::gemm_grouped): C = alpha op(A) op(B)
// + beta C with op(A) M x K, op(B) K x N, row-major with leading dimensions; its own header
// so the CUDA kernels' declarations need not see the whole Backend.
#pragma once

namespace pipetrain {

struct GemmProblem {
  int M, N, K;
  const float* A;
  int lda;
  const float* B;
  int ldb;
  float* C;
  int ldc;
};

}  // namespace pipetrain
