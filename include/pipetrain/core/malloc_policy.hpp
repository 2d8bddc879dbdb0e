// Freed host memory kept for reuse.
//
// glibc's malloc returns a block above its mmap threshold to the kernel when it is freed,
// and trims its heap's top once that exceeds the trim threshold. A library that allocates
// and frees large scratch buffers every step then touches fresh pages every step: MPI's
// nonblocking collectives do (Open MPI's libnbc allocates each all-reduce's temporary per
// call), so every data-parallel step of GPT-2 124M took 9,500-38,000 page faults and
// 0.2-0.6 s of kernel time on a 2-core KVM guest (bench/RESULTS.md). keep_freed_host_memory()
// raises the mmap threshold to glibc's largest (32 MiB) and turns trimming off, so such
// blocks are reused; larger ones (parameters, the memory pool's) are still mapped and
// unmapped as before. A setting the user made (MALLOC_MMAP_THRESHOLD_,
// MALLOC_TRIM_THRESHOLD_, or GLIBC_TUNABLES with glibc.malloc.mmap_threshold or
// trim_threshold) is left alone; another allocator (jemalloc, tcmalloc through LD_PRELOAD)
// keeps its own policy.
//
// Exports: keep_freed_host_memory(), malloc_policy_summary(), kMallocKeepBelow.
#pragma once
#include <cstddef>
#include <string>

namespace pipetrain {

// glibc's ceiling for M_MMAP_THRESHOLD on 64-bit systems (4 MiB x sizeof(long)).
inline constexpr size_t kMallocKeepBelow = size_t{32} << 20;

// Call once, early (main does, before MPI starts). Safe to call again.
void keep_freed_host_memory();

// For --version, e.g. "glibc, freed blocks below 32 MiB kept for reuse
// (set by pipetrain)", "glibc, MALLOC_TRIM_THRESHOLD_ set: left as is", "not glibc's: left as is".
std::string malloc_policy_summary();

}  // namespace pipetrain
