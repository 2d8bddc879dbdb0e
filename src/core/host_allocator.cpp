#include "pipetrain/core/host_allocator.hpp"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>

#include "pipetrain/core/error.hpp"

namespace pipetrain {

namespace {
// Blocks this large are mapped on their own, not carved from malloc's heap: a memory pool
// keeps them for the whole run, and in the heap they would sit between the transient
// buffers libraries allocate each step (an MPI collective's temporaries), which then cannot
// reuse the space they freed and take fresh pages every step. Under AddressSanitizer every
// block stays malloc's, so its bounds checks see them all.
#if defined(__SANITIZE_ADDRESS__)
constexpr size_t kMapFrom = SIZE_MAX;
#else
constexpr size_t kMapFrom = size_t{1} << 20;
#endif
size_t rounded(size_t bytes) { return bytes == 0 ? 64 : (bytes + 63) / 64 * 64; }
}  // namespace

void* HostAllocator::allocate(size_t bytes) {
  if (bytes > SIZE_MAX - 64) fail("cannot allocate {} bytes of host memory (size too large)", bytes);
  if (rounded(bytes) >= kMapFrom) {
    void* p = ::mmap(nullptr, rounded(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) fail("out of host memory: {} bytes requested", bytes);
    return p;  // page aligned
  }
  void* p = std::aligned_alloc(64, rounded(bytes));  // aligned_alloc needs a multiple of the alignment
  if (!p) fail("out of host memory: {} bytes requested", bytes);
  return p;
}

void HostAllocator::deallocate(void* p, size_t bytes) {
  if (rounded(bytes) >= kMapFrom)
    ::munmap(p, rounded(bytes));
  else
    std::free(p);
}

}  // namespace pipetrain
