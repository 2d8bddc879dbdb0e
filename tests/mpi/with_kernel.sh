#!/usr/bin/env bash
# with_kernel.sh KERNEL COMMAND...: runs COMMAND with OpenBLAS forced to KERNEL
# (OPENBLAS_CORETYPE), so the equivalence suites run under more than one summation
# order. Exits 77 (CTest: skipped) when this CPU lacks the kernel's instruction set, or
# when the kernel OpenBLAS runs anyway (detected or set) has the same sgemm arithmetic:
# the plain mpi.npN runs already cover it (SkylakeX = Cooperlake, Haswell = Zen).
set -euo pipefail
kernel=$1
shift
case $kernel in
  SkylakeX | Cooperlake) isa=avx512f family="SkylakeX Cooperlake" ;;
  Haswell | Zen) isa=avx2 family="Haswell Zen" ;;
  *) isa="" family=$kernel ;;
esac
if [ -n "$isa" ] && ! grep -qw "$isa" /proc/cpuinfo; then
  echo "SKIP: this CPU has no $isa for the $kernel kernel"
  exit 77
fi
# OpenBLAS names the kernel it loads when OPENBLAS_VERBOSE=2 ("Core: Haswell"): ask the
# test program (the command's *_tests argument) to list its tests.
running=""
for arg in "$@"; do
  if [[ $arg == *_tests && -x $arg ]]; then
    running=$(OPENBLAS_VERBOSE=2 "$arg" --gtest_list_tests 2>&1 | sed -n 's/^Core: //p' | head -n 1 || true)
  fi
done
if [[ " $family " == *" $running "* ]]; then
  echo "SKIP: OpenBLAS already runs $running here, the same sgemm arithmetic as $kernel (mpi.npN covers it)"
  exit 77
fi
export OPENBLAS_CORETYPE=$kernel
exec "$@"
