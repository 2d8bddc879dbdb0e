#!/usr/bin/env bash
# scripts/gpu-check.sh stays runnable: on a machine without a GPU it prints one
# "no GPU: skipped" line per check and exits 0 (on a GPU machine it is run by hand).
set -euo pipefail
: "${SRC:?}"
bash -n "$SRC/scripts/gpu-check.sh"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "a GPU is present: run scripts/gpu-check.sh itself"
  exit 77
fi
out=$(bash "$SRC/scripts/gpu-check.sh")
echo "$out"
n=$(grep -c "^gpu-check: .*: SKIP — no GPU: skipped$" <<<"$out")
[ "$n" -eq 6 ] || { echo "FAIL: expected 6 skipped checks, got $n"; exit 1; }
