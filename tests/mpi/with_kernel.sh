#!/usr/bin/env bash
# with_kernel.sh KERNEL COMMAND...: runs COMMAND with OpenBLAS forced to KERNEL
# (OPENBLAS_CORETYPE), so the equivalence suites run under more than one summation
# order. Exits 77 (CTest: skipped) when this CPU lacks the kernel's instruction set.
set -euo pipefail
kernel=$1
shift
case $kernel in
  SkylakeX | Cooperlake) isa=avx512f ;;
  Haswell | Zen) isa=avx2 ;;
  *) isa= ;;
esac
if [ -n "$isa" ] && ! grep -qw "$isa" /proc/cpuinfo; then
  echo "skipped: this CPU has no $isa for the $kernel kernel"
  exit 77
fi
export OPENBLAS_CORETYPE=$kernel
exec "$@"
