// keep_freed_host_memory(): large scratch buffers freed and allocated again, as MPI's
// nonblocking collectives do every step, come back without touching fresh pages.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "pipetrain/core/malloc_policy.hpp"

#if defined(__SANITIZE_ADDRESS__)
#define PT_SANITIZED_MALLOC 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer)
#define PT_SANITIZED_MALLOC 1
#endif
#endif

namespace pipetrain {
namespace {

[[maybe_unused]] long minor_faults() {
  rusage r{};
  getrusage(RUSAGE_SELF, &r);
  return r.ru_minflt;
}

// One step's scratch: 16 blocks of 12 MiB (half a 25 MiB dp bucket each), every page
// written, then all freed. Returns the minor page faults it took.
[[maybe_unused]] long scratch_round() {
  constexpr size_t kBlock = size_t{12} << 20;
  const long before = minor_faults();
  std::vector<void*> blocks;
  for (int i = 0; i < 16; ++i) {
    blocks.push_back(std::malloc(kBlock));
    if (!blocks.back()) return -1;
    std::memset(blocks.back(), i, kBlock);
  }
  for (void* b : blocks) std::free(b);
  return minor_faults() - before;
}

TEST(MallocPolicy, FreedScratchBuffersAreReusedNotFaultedAgain) {
#if !defined(__GLIBC__) || defined(PT_SANITIZED_MALLOC)
  GTEST_SKIP() << "glibc's malloc is not the allocator here";
#else
  keep_freed_host_memory();
  const std::string how = malloc_policy_summary();
  if (how.find("left as is") != std::string::npos) GTEST_SKIP() << "the environment sets malloc's policy: " << how;
  EXPECT_NE(how.find("kept for reuse"), std::string::npos) << how;
  constexpr long kPages = 16 * (12l << 20) / 4096;
  const long first = scratch_round();
  ASSERT_GE(first, 0) << "malloc failed";
  scratch_round();  // the heap may still settle its layout here (one block's pages, measured)
  // glibc's default gives the kernel the freed blocks back (or trims them off its heap):
  // every round then faults each page again. Kept, the later rounds fault (almost) none.
  for (int round = 3; round <= 4; ++round) {
    const long faults = scratch_round();
    EXPECT_LT(faults, kPages / 50) << "round " << round << "; the first took " << first << " faults for " << kPages
                                   << " pages";
  }
  keep_freed_host_memory();  // again: harmless
  EXPECT_EQ(malloc_policy_summary(), how);
#endif
}

}  // namespace
}  // namespace pipetrain
