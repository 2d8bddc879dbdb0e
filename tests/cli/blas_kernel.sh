#!/usr/bin/env bash
# Kernel selection (pipetrain/backend/blas_kernel.hpp): a fallback or pinned OpenBLAS
# kernel is replaced by the CPU's best before the first product, once that kernel's
# products pass their check, and the header says so; a failed check keeps the kernel and
# says why; PIPETRAIN_BLAS_KERNEL=keep never corrects; bf16
# products name their path (pipetrain/backend/bf16_products.hpp) and PIPETRAIN_BF16_GEMM
# is honoured.
set -euo pipefail
: "${PIPETRAIN:?}" "${SRC:?}" "${MPIEXEC:?}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$SRC/tests/cli/lib/expect.sh"
cd "$tmp"
version() { env -u OPENBLAS_CORETYPE -u PIPETRAIN_BLAS_KERNEL "$@" "$PIPETRAIN" --version | grep "^backends:"; }
if ! version | grep -Eq 'BLAS [A-Za-z0-9_]+ \((detected|corrected from)'; then
  echo "SKIP: not OpenBLAS ($(version)): the kernel selection is OpenBLAS's"
  exit 77
fi

echo "== PIPETRAIN_BLAS_KERNEL=keep honours OPENBLAS_CORETYPE (and the header says what this CPU could run)"
out=$(version OPENBLAS_CORETYPE=Prescott PIPETRAIN_BLAS_KERNEL=keep)
expect_contains "$out" "BLAS Prescott (OPENBLAS_CORETYPE" "keep"
set +e
err=$(version PIPETRAIN_BLAS_KERNEL=fastest 2>&1)
rc=$?
set -e
[ $rc -ne 0 ] || die "an unknown PIPETRAIN_BLAS_KERNEL was accepted"
expect_contains "$err" "PIPETRAIN_BLAS_KERNEL=fastest: expected auto, best or keep" "unknown policy"

if ! grep -qw avx /proc/cpuinfo; then
  echo "SKIP: the correction: this CPU has no AVX (Prescott is its best kernel); the honouring checks passed"
  exit 77
fi
echo "== a pinned older kernel is replaced by the CPU's best once that kernel's products pass their check"
out=$(version OPENBLAS_CORETYPE=Prescott)
expect_contains "$out" "(corrected from Prescott, pinned by OPENBLAS_CORETYPE, on this" "correction of a pin"
expect_contains "$out" "its products checked here)" "correction of a pin"
[[ $out != *"BLAS Prescott"* ]] || die "still Prescott after the correction: $out"
if "$PIPETRAIN" --version | grep -q "fault injection: on"; then
  echo "== a kernel whose check fails (here: dies, or reports an error) is not taken, and the header says why"
  out=$(version OPENBLAS_CORETYPE=Prescott PIPETRAIN_FAULT=0:blas-check:kill 2>/dev/null)
  expect_contains "$out" "BLAS Prescott (OPENBLAS_CORETYPE; " "a check that dies"
  expect_contains "$out" "failed its product check here: its check died of signal 9" "a check that dies"
  out=$(version OPENBLAS_CORETYPE=Prescott PIPETRAIN_FAULT=0:blas-check:throw)
  expect_contains "$out" "failed its product check here: injected fault at blas-check" "a check that fails"
else
  echo "fault injection compiled out: the failing-check cases are not run"
fi
echo "== a fallback kernel is corrected before the first product, also under mpiexec"
head -c 50000 "$SRC/inputs/austen.txt" >c.txt
"$PIPETRAIN" data text c.txt -o c.h5 >/dev/null
OPENBLAS_CORETYPE=Prescott timeout 120 "$MPIEXEC" -np 2 \
  -x OPENBLAS_CORETYPE "$PIPETRAIN" train "$SRC/inputs/austen-char.toml" \
  --set data.train=c.h5 --set model.n_layer=2 --set model.d_model=32 --set train.seq_len=16 \
  --set model.max_seq_len=16 --set train.steps=2 --set parallel.pp=2 --set log.progress=false >train.out
expect_contains "$(cat train.out)" "(corrected from Prescott, pinned by OPENBLAS_CORETYPE, on this" "train header"
grep -q "^step" train.out || die "the corrected run did not train: $(cat train.out)"

echo "== BLAS threads: each rank its share of the CPUs it may run on; a user's count is honoured"
cpus=$(nproc)
share=$((cpus / 2 > 0 ? cpus / 2 : 1))
threads() { env -u OPENBLAS_NUM_THREADS -u GOTO_NUM_THREADS -u OMP_NUM_THREADS "$@" | grep "^backends:" | sort -u; }
out=$(threads timeout 60 "$MPIEXEC" -np 2 --bind-to none "$PIPETRAIN" --version)
want="$share thread"; if [ "$share" -gt 1 ]; then want="$share threads"; fi
expect_contains "$out" "$want ($cpus CPU" "two unbound ranks"
expect_contains "$out" "shared by 2 ranks)" "two unbound ranks"
[ "$(echo "$out" | wc -l)" -eq 1 ] || die "the two ranks chose differently: $out"
out=$(threads env OPENBLAS_NUM_THREADS=1 "$PIPETRAIN" --version)
expect_contains "$out" "1 thread (OPENBLAS_NUM_THREADS)" "the user's count"
echo "== bf16 products: the header names the path; PIPETRAIN_BF16_GEMM is honoured, and checked"
bf16() { env -u PIPETRAIN_BF16_GEMM "$@" "$PIPETRAIN" --version | grep "^backends:"; }
out=$(bf16)
expect_contains "$out" "; bf16 products: " "the header"
out=$(bf16 PIPETRAIN_BF16_GEMM=sgemm)
expect_contains "$out" "bf16 products: sgemm on widened operands (PIPETRAIN_BF16_GEMM)" "sgemm asked for"
set +e
err=$(bf16 PIPETRAIN_BF16_GEMM=mkl 2>&1)
rc=$?
set -e
[ $rc -ne 0 ] || die "an unknown PIPETRAIN_BF16_GEMM was accepted"
expect_contains "$err" "PIPETRAIN_BF16_GEMM=mkl: expected auto, onednn or sgemm" "unknown policy"
if [[ $(bf16) == *"bf16 products: oneDNN"* ]]; then
  # This CPU runs bf16 natively: a bf16 run takes oneDNN on every rank, and the forced
  # widening still trains.
  head -c 50000 "$SRC/inputs/austen.txt" >b.txt
  "$PIPETRAIN" data text b.txt -o b.h5 >/dev/null
  for path in auto sgemm; do
    PIPETRAIN_BF16_GEMM=$path timeout 120 "$MPIEXEC" -np 2 -x PIPETRAIN_BF16_GEMM "$PIPETRAIN" train \
      "$SRC/inputs/austen-char.toml" --set data.train=b.h5 --set model.n_layer=2 --set model.d_model=32 \
      --set train.seq_len=16 --set model.max_seq_len=16 --set train.steps=2 --set parallel.pp=2 \
      --set train.precision=bf16 --set log.progress=false >bf16.$path.out
    grep -q "^step" bf16.$path.out || die "the bf16 run ($path) did not train: $(cat bf16.$path.out)"
  done
  expect_contains "$(cat bf16.auto.out)" "bf16 products: oneDNN" "bf16 train header"
  expect_contains "$(cat bf16.sgemm.out)" "bf16 products: sgemm on widened operands" "bf16 train header, sgemm"
else
  echo "oneDNN does not run bf16 natively here: $(bf16)"
fi
echo "kernel selection checks passed"
