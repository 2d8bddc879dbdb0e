// A BLAS kernel's products checked against a double-precision reference, before a run
// trusts a kernel other than the one the environment asked for.
//
// OPENBLAS_CORETYPE pins exist because some OpenBLAS builds compute wrong results, or
// crash, on CPUs newer than they know; pipetrain replaces a pinned or fallback kernel
// with the CPU's best only after that kernel multiplies correctly here
// (pipetrain/backend/blas_kernel.hpp runs this in a child process with the kernel asked
// for, so a crash costs the child, not the run).
#pragma once
#include <functional>
#include <string>

namespace pipetrain {

// Row-major C = alpha op(A) op(B) + beta C, as cblas_sgemm takes it.
using SgemmFn = std::function<void(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                                   const float* B, int ldb, float beta, float* C, int ldc)>;

struct ProductCheck {
  bool passed = false;
  int products = 0;    // products compared
  double worst = 0;    // largest |C - reference| over its bound, over every element
  std::string failure; // the first product out of bounds ("" when passed)
};

// Every transpose, sizes from 1 to past a kernel's blocking (odd edges, K of 1 and of
// thousands, padded leading dimensions), alpha and beta of both kinds, against a double
// reference. An element passes within (K + 2) u (|alpha| sum_k |a_ik b_kj| + |beta c_ij|),
// u = 2^-24: each of the K products and K - 1 sums rounds once (Higham's gamma_K), alpha
// and the beta update once more each.
ProductCheck check_sgemm(const SgemmFn& sgemm);

}  // namespace pipetrain
