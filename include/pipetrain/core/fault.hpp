// Fault injection: the one seam through which tests make a rank fail.
//
// Production code marks named points with `fault::point("forward")` and does nothing
// else. A test arms a fault with the environment variable
//
//   PIPETRAIN_FAULT="RANK:POINT:KIND[:N]"   (several separated by commas)
//
// which makes world rank RANK, the N-th time (default 1) it reaches POINT, do KIND:
//   throw  throw pipetrain::Error("injected fault ...")
//   oom    throw std::bad_alloc (what a failed allocation raises)
//   hang   print a line, then sleep forever (the watchdog and the launcher end the job)
//   kill   print a line, then raise SIGKILL (the process dies without a word of its own)
// Points: forward, backward, p2p-wait, collective, optimizer, checkpoint-write, eval,
// blas-check (the child that checks an OpenBLAS kernel, pipetrain/backend/blas_kernel.hpp).
//
// Configure with -DPIPETRAIN_FAULT_INJECTION=OFF to compile the seam out: `point` is
// then an empty inline function and the variable is ignored.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace pipetrain::fault {

// Every point name production code may pass (a spec naming another one is an error).
const std::vector<std::string>& point_names();

#if PIPETRAIN_FAULT_INJECTION
namespace detail {
extern bool g_armed;
void reached(std::string_view point);
}  // namespace detail

// Reads PIPETRAIN_FAULT for this world rank; throws pipetrain::Error on a malformed spec.
void arm_from_environment(int world_rank);
// Arms `spec` (same syntax as the variable) directly; "" disarms. For unit tests.
void arm(const std::string& spec, int world_rank);

inline void point(std::string_view name) {
  if (detail::g_armed) detail::reached(name);
}
inline constexpr bool compiled_in = true;
#else
inline void arm_from_environment(int) {}
inline void arm(const std::string&, int) {}
inline void point(std::string_view) {}
inline constexpr bool compiled_in = false;
#endif

}  // namespace pipetrain::fault
