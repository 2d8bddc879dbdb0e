// PIPETRAIN_HOST_DEVICE: marks a function both backends compile, the CPU's as plain C++
// and the CUDA backend's for host and device, so the two cannot drift.
#pragma once

#if defined(__CUDACC__)
#define PIPETRAIN_HOST_DEVICE __host__ __device__
#else
#define PIPETRAIN_HOST_DEVICE
#endif
