#!/usr/bin/env bash
# scripts/gpu-check.sh stays runnable and decisive. Without a GPU it prints one
# "no GPU: skipped" line per check and exits 0; told there is one, its kernel step fails
# when every CUDA case skips. Rehearsed with stand-in steps (the hook the
# script offers, PIPETRAIN_GPU_CHECK_STANDINS): a failing step is reported with its first
# failure's log at the end, a step that hangs is killed at its limit (its children too) and
# the later steps still run, and the total budget is enforced: what it leaves no time for
# is reported skipped, and the script ends within it.
set -euo pipefail
: "${SRC:?}" "${PIPETRAIN:?}"
bash -n "$SRC/scripts/gpu-check.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "a GPU is present: the no-GPU run is not checked here (run scripts/gpu-check.sh itself)"
else
  out=$(bash "$SRC/scripts/gpu-check.sh" "$tmp/none")
  n=$(grep -c "^gpu-check: .*: SKIP — no GPU: skipped$" <<<"$out")
  [ "$n" -eq 9 ] || { echo "FAIL: expected 9 skipped checks, got $n"; exit 1; }
  [ ! -e "$tmp/none" ] || { echo "FAIL: a run without a GPU wrote logs"; exit 1; }
  # The real kernel step, told a GPU is there: every CUDA case skips, and that is a FAIL.
  cat >"$tmp/no-gpu.sh" <<'STANDINS'
have_gpu() { true; }
for c in "${checks[@]}"; do [ "$c" = kernels ] || eval "check_${c//-/_}() { return 77; }"; done
STANDINS
  set +e
  out=$(PIPETRAIN_GPU_BUILD="$(dirname "$(dirname "$PIPETRAIN")")" PIPETRAIN_GPU_CHECK_STANDINS="$tmp/no-gpu.sh" \
        bash "$SRC/scripts/gpu-check.sh" "$tmp/fake")
  rc=$?
  set -e
  head -3 <<<"$out"
  if [ "$rc" -ne 1 ] || ! grep -q "^gpu-check: kernels: FAIL — .* CUDA cases found no GPU" <<<"$out"; then
    echo "FAIL: the kernel step passed with every CUDA case skipped"
    exit 1
  fi
fi

cat >"$tmp/standins.sh" <<'STANDINS'
have_gpu() { true; }
build_gpu() { echo "detail: a stand-in build"; }
check_kernels() { echo "Expected equality: the stand-in's first failure, in full"; return 1; }
check_cudnn_attention() { return 77; }
check_demo_fp32() { sleep 61; }                  # hangs: killed at its limit
limit[demo-fp32]=1
check_demo_bf16() { echo "detail: ran after the hang"; }
check_two_ranks_one_gpu() { sleep 61 & wait; }   # a child that would outlive the budget
limit[two-ranks-one-gpu]=60
check_nccl_one_gpu() { echo "detail: must not run: no budget left"; }
STANDINS
start=$SECONDS
set +e
out=$(PIPETRAIN_GPU_CHECK_STANDINS="$tmp/standins.sh" PIPETRAIN_GPU_CHECK_BUDGET=8 \
      bash "$SRC/scripts/gpu-check.sh" "$tmp/logs")
rc=$?
set -e
took=$((SECONDS - start))
echo "$out"
fail() { echo "FAIL: $*"; exit 1; }
[ "$rc" -eq 1 ] || fail "exit status $rc, expected 1"
[ "$took" -le 12 ] || fail "took $took s against a budget of 8"
grep -q "^gpu-check: build: PASS — a stand-in build$" <<<"$out" || fail "build line"
grep -q "^gpu-check: kernels: FAIL — Expected equality" <<<"$out" || fail "kernels line"
grep -q "^gpu-check: demo-fp32: FAIL — killed after 1 s" <<<"$out" || fail "the hang's line"
grep -q "^gpu-check: demo-bf16: PASS — ran after the hang$" <<<"$out" || fail "the step after the hang"
grep -q "^gpu-check: two-ranks-one-gpu: FAIL — killed after" <<<"$out" || fail "the budget's kill"
for c in nccl-one-gpu nccl-two-gpus sanitizers gpt2-124m-bf16; do
  grep -q "^gpu-check: $c: SKIP — the time budget (8 s) is spent$" <<<"$out" || fail "$c not skipped for the budget"
done
grep -q "^gpu-check: the first failure, kernels" <<<"$out" || fail "no first failure"
grep -q "^Expected equality: the stand-in's first failure, in full$" <<<"$out" || fail "the first failure's log"
[ "$(wc -l <"$tmp/logs/summary.txt")" -eq 10 ] || fail "summary.txt: $(cat "$tmp/logs/summary.txt")"
[ -s "$tmp/logs/kernels.log" ] || fail "no kernels.log"
sleep 0.5
if pgrep -f "^sleep 61$" >/dev/null; then fail "a killed step's child survived"; fi
echo "gpu-check rehearsal passed in $took s"
