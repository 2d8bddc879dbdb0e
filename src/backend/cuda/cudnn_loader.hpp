// cuDNN, opened when the CUDA backend first runs attention on it (cudnn_attention.cpp)
// instead of when the process starts: linked, libcudnn and the sub-libraries it pulls in
// would cost every pipetrain process their loading time, CPU runs included, as cuBLAS did
// (cublas_loader.hpp). Exports cudnn(): opens libcudnn.so.<major> once (thread-safe; the
// library loads its graph, heuristic and engine sub-libraries itself) and resolves the
// functions the attention graphs call; it throws Error naming the library and dlerror()'s
// reason when it cannot. Also PIPETRAIN_CUDNN_FUNCTIONS, the list of those functions.
#pragma once
#include <cudnn_graph.h>

namespace pipetrain::cuda {

// clang-format off
#define PIPETRAIN_CUDNN_FUNCTIONS(X)                                                                        \
  X(cudnnGetVersion) X(cudnnGetErrorString) X(cudnnGetLastErrorString) X(cudnnCreate) X(cudnnDestroy)     \
  X(cudnnSetStream) X(cudnnBackendCreateDescriptor) X(cudnnBackendDestroyDescriptor)                      \
  X(cudnnBackendSetAttribute) X(cudnnBackendGetAttribute) X(cudnnBackendFinalize) X(cudnnBackendExecute)
// clang-format on

struct CudnnApi {
#define PIPETRAIN_CUDNN_MEMBER(name) decltype(&::name) name = nullptr;
  PIPETRAIN_CUDNN_FUNCTIONS(PIPETRAIN_CUDNN_MEMBER)
#undef PIPETRAIN_CUDNN_MEMBER
};

const CudnnApi& cudnn();

}  // namespace pipetrain::cuda
