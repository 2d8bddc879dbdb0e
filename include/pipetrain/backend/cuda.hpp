// The CUDA backend (src/backend/cuda): the Backend interface on one NVIDIA GPU,
// cuBLAS for the f32 matrix products, cuBLASLt for the bf16 ones (with bias and GELU
// epilogues), flash attention (O(T) per row) and hand-written kernels for the rest. Built when
// CMake finds nvcc (PIPETRAIN_ENABLE_CUDA=AUTO|ON; PIPETRAIN_HAVE_CUDA is then
// defined for every user of pipetrain_lib); otherwise these functions exist but
// report that the build has no CUDA.
//
// Memory from allocate() is device memory; copy() takes device or pageable host
// pointers on either side (cudaMemcpyDefault, unified addressing) and returns once host
// memory involved in it is safe to use (CUDA stages pageable memory; pass pinned memory
// through to_host / to_device, which synchronise). Kernels are queued on the backend's own stream;
// sum_squares, all_finite, to_host and the target/token checks of the cross-entropy
// and embedding kernels wait for it.
//
// Numerics: fp32 everywhere but gemm_bf16 (bf16 operands, f32 accumulation: the bf16
// tensor cores), TF32 tensor cores off by default for f32 products (set
// PIPETRAIN_CUDA_TF32=1 to allow them in cuBLAS; results then differ from the CPU
// backend by ~1e-3 relative). Every kernel is deterministic run to run: reductions
// have a fixed shape and no kernel uses floating-point atomics. The embedding
// gradients (embedding_backward, embedding_scatter, position_backward) even add in
// the CPU backend's order and match it bit for bit.
#pragma once
#include <memory>
#include <string>

#include "pipetrain/backend/backend.hpp"

namespace pipetrain {

// The CUDA backend on GPU `device`. device = -1 picks the node-local rank
// (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID or MPI_LOCALRANKID; 0 if none is set)
// modulo the number of visible devices. Throws Error when the build has no CUDA, no
// device is usable, or `device` is out of range.
std::unique_ptr<Backend> make_cuda_backend(int device = -1);

// True when make_cuda_backend() can work: the build has CUDA and at least one
// device is visible. Otherwise false, with the reason in *why (if given), e.g.
// "cudaGetDeviceCount: no CUDA-capable device is detected".
bool cuda_available(std::string* why = nullptr);

// For `pipetrain --version`: "CUDA 13.0, built for sm_90", or "not built".
std::string cuda_build_summary();

}  // namespace pipetrain
