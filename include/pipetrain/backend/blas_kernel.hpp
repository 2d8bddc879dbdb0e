// Running the machine's best BLAS kernel without the user knowing BLAS internals.
//
// OpenBLAS picks its kernel ("core") from the CPU's identity when the library loads; on
// a CPU it does not know it falls back to an old generic core (seen: Prescott, SSE3, at
// a fifth of the speed on an AVX-512 Xeon). The only cure is OPENBLAS_CORETYPE, read
// when the library loads, so `select_blas_kernel` — first thing in main, before MPI
// starts — compares the core OpenBLAS chose with the instruction set cpuid reports and,
// when the core is older, re-executes the process with OPENBLAS_CORETYPE naming the
// best core for this CPU. A user's own OPENBLAS_CORETYPE is honoured, and any other
// BLAS (MKL, BLIS, ArmPL through CBLAS) is left alone.
//
// PIPETRAIN_BLAS_KERNEL chooses the policy: `auto` (default: correct a fallback unless
// OPENBLAS_CORETYPE is set), `keep` (never correct), `best` (correct also over an
// OPENBLAS_CORETYPE naming an older core, e.g. a stale one exported by a site module).
#pragma once
#include <string>

namespace pipetrain {

// The vector instruction set of this CPU, as cpuid reports it.
struct CpuIsa {
  bool avx = false, avx2_fma = false, avx512 = false, avx512_bf16 = false;
  bool amd = false;
};
CpuIsa detect_cpu_isa();

// The OpenBLAS core to run instead of `running` on a CPU with `isa`, or "" when
// `running` is already as good (or not an x86 core name this knows).
std::string better_openblas_core(const std::string& running, const CpuIsa& isa);

// May re-execute the process (execv of /proc/self/exe with the same argv) with
// OPENBLAS_CORETYPE set; returns when no correction is needed or possible.
void select_blas_kernel(char** argv);

// The kernel in use and how it was chosen, for the header and --version:
// "Cooperlake (detected)", "Prescott (OPENBLAS_CORETYPE)",
// "SkylakeX (corrected from Prescott on this AVX-512 CPU)".
std::string blas_kernel_summary();

}  // namespace pipetrain
