#include "pipetrain/core/host_allocator.hpp"

#include <cstdint>
#include <cstdlib>

#include "pipetrain/core/error.hpp"

namespace pipetrain {

void* HostAllocator::allocate(size_t bytes) {
  if (bytes > SIZE_MAX - 64) fail("cannot allocate {} bytes of host memory (size too large)", bytes);
  const size_t rounded = (bytes + 63) / 64 * 64;  // aligned_alloc needs a multiple of the alignment
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (!p) fail("out of host memory: {} bytes requested", bytes);
  return p;
}

void HostAllocator::deallocate(void* p, size_t /*bytes*/) { std::free(p); }

}  // namespace pipetrain
