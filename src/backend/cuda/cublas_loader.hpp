// cuBLAS and cuBLASLt, opened when the first CUDA backend starts instead of when the
// process does. Linked directly, libcublasLt alone cost every pipetrain process half a
// second of start-up (its loading and static initialisers, measured with an empty program:
// 0.52 s against 0.01 s), on every rank and for every command, CPU runs included.
// cublas() opens both libraries once (thread-safe) and resolves the functions the backend
// calls; it throws Error naming the library and dlerror()'s reason when it cannot.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>

namespace pipetrain::cuda {

// clang-format off
#define PIPETRAIN_CUBLAS_FUNCTIONS(X)                                                                       \
  X(cublasCreate_v2) X(cublasDestroy_v2) X(cublasSetStream_v2) X(cublasSetMathMode) X(cublasGetVersion_v2)  \
  X(cublasGetStatusName) X(cublasGetStatusString) X(cublasSgemm_v2) X(cublasSgemmStridedBatched)
#define PIPETRAIN_CUBLASLT_FUNCTIONS(X)                                                                     \
  X(cublasLtCreate) X(cublasLtDestroy) X(cublasLtMatmul) X(cublasLtMatmulAlgoGetHeuristic)                 \
  X(cublasLtMatmulDescCreate) X(cublasLtMatmulDescDestroy) X(cublasLtMatmulDescSetAttribute)               \
  X(cublasLtMatmulPreferenceCreate) X(cublasLtMatmulPreferenceDestroy)                                     \
  X(cublasLtMatmulPreferenceSetAttribute) X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutDestroy)
// Optional: null where the library lacks them (grouped products: cuBLAS 12.5 and later).
#if CUBLAS_VER_MAJOR > 12 || (CUBLAS_VER_MAJOR == 12 && CUBLAS_VER_MINOR >= 5)
#define PIPETRAIN_CUBLAS_OPTIONAL_FUNCTIONS(X) X(cublasSgemmGroupedBatched)
#else
#define PIPETRAIN_CUBLAS_OPTIONAL_FUNCTIONS(X)
#endif
// clang-format on

struct CublasApi {
#define PIPETRAIN_CUBLAS_MEMBER(name) decltype(&::name) name = nullptr;
  PIPETRAIN_CUBLAS_FUNCTIONS(PIPETRAIN_CUBLAS_MEMBER)
  PIPETRAIN_CUBLASLT_FUNCTIONS(PIPETRAIN_CUBLAS_MEMBER)
  PIPETRAIN_CUBLAS_OPTIONAL_FUNCTIONS(PIPETRAIN_CUBLAS_MEMBER)
#undef PIPETRAIN_CUBLAS_MEMBER
};

const CublasApi& cublas();

}  // namespace pipetrain::cuda
