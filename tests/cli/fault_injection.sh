#!/usr/bin/env bash
# Fail fast: a rank that fails at any named point (pipetrain/core/fault.hpp) — an error,
# an allocation failure, a hang, a kill — ends the whole job promptly with the injected
# message and a non-zero exit, on a pp = 2 job and on a tp = 2 x dp = 2 job. Prints the
# time from launch to exit of every case (the figures quoted in the results).
set -euo pipefail
: "${PIPETRAIN:?}" "${SRC:?}" "${MPIEXEC:?}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$SRC/tests/cli/lib/expect.sh"
cd "$tmp"
head -c 100000 "$SRC/inputs/austen.txt" >c.txt
"$PIPETRAIN" data text c.txt -o c.h5 >/dev/null
# Two steps of 2 microbatches, validation after each step, a checkpoint after step 1;
# the watchdog ends true hangs after 3 s.
cfg=(train "$SRC/inputs/austen-char.toml" --set data.train=c.h5 --set data.val=c.h5 --set model.n_layer=2
     --set model.d_model=64 --set train.seq_len=32 --set model.max_seq_len=32 --set train.steps=2
     --set train.global_batch=8 --set train.microbatches=2 --set train.eval_every=1 --set train.eval_batches=1
     --set checkpoint.dir=ck --set checkpoint.every=1 --set log.every=1 --set runtime.timeout_s=3)
if [ "$("$PIPETRAIN" --version | grep -c 'fault injection: off')" -ne 0 ]; then
  echo "SKIP: built with PIPETRAIN_FAULT_INJECTION=OFF, so no fault can be injected"
  exit 77
fi

declare -a report
# run_case LAYOUT NP RANK POINT KIND OCCURRENCE NEEDLE [extra --set ...]
run_case() {
  local layout=$1 np=$2 rank=$3 point=$4 kind=$5 at=$6 needle=$7
  shift 7
  local spec="$rank:$point:$kind:$at" rc=0
  local t0 t1
  t0=$(date +%s.%N)
  PIPETRAIN_FAULT=$spec timeout 60 "$MPIEXEC" -np "$np" -x PIPETRAIN_FAULT "$PIPETRAIN" "${cfg[@]}" "$@" \
    >out.txt 2>err.txt || rc=$?
  t1=$(date +%s.%N)
  local secs
  secs=$(python3 -c "print(f'{$t1 - $t0:.1f}')")
  [[ $rc -ne 0 ]] || die "$layout $spec: the job succeeded"
  [[ $rc -ne 124 ]] || die "$layout $spec: the job hung (killed by timeout after 60 s): $(tail -5 err.txt)"
  grep -qF "$needle" err.txt || die "$layout $spec: expected '$needle' in: $(cat err.txt)"
  # The injected error is printed once (by the rank that raised it), never as a cascade.
  if [[ $kind == throw || $kind == oom ]]; then
    [[ $(grep -c "pipetrain: error" err.txt) -eq 1 ]] || die "$layout $spec: expected one error line: $(cat err.txt)"
  fi
  python3 -c "import sys; sys.exit(0 if $secs <= 30 else 1)" || die "$layout $spec: took $secs s to end"
  report+=("$(printf '%-12s %-18s %-6s %5s s' "$layout" "$point@$at" "$kind" "$secs")")
  echo "ok: $layout $spec ended in $secs s (exit $rc)"
}

# For scale: the same jobs without a fault, from launch to a clean exit.
for layout in pp2 tp2xdp2; do
  if [[ $layout == pp2 ]]; then np=2 set=(--set parallel.pp=2); else np=4 set=(--set parallel.tp=2 --set parallel.dp=2); fi
  t0=$(date +%s.%N)
  timeout 120 "$MPIEXEC" -np "$np" "$PIPETRAIN" "${cfg[@]}" "${set[@]}" >out.txt 2>err.txt || die "clean $layout run failed: $(cat err.txt)"
  t1=$(date +%s.%N)
  report+=("$(printf '%-12s %-18s %-6s %5s s' "$layout" "(no fault)" "-" "$(python3 -c "print(f'{$t1 - $t0:.1f}')")")")
  rm -rf ck
done

for layout in pp2 tp2xdp2; do
  if [[ $layout == pp2 ]]; then np=2 r=1 set=(--set parallel.pp=2); else np=4 r=3 set=(--set parallel.tp=2 --set parallel.dp=2); fi
  # Every point raises an error on rank r (the last rank), in the middle of the run (a pp = 2
  # run of these 2 steps makes 10 collective calls on rank 1 in all). The points that only
  # raise where the rank computes are the same code on either layout: pp = 2 shows them;
  # tp 2 x dp 2 keeps the collective, where its other communicators must learn of it.
  if [[ $layout == pp2 ]]; then
    run_case $layout $np $r forward throw 3 "error (rank $r): injected fault at forward" "${set[@]}"
    run_case $layout $np $r backward throw 3 "error (rank $r): injected fault at backward" "${set[@]}"
    run_case $layout $np $r p2p-wait throw 2 "error (rank $r): injected fault at p2p-wait" "${set[@]}"
    run_case $layout $np $r optimizer throw 2 "error (rank $r): injected fault at optimizer" "${set[@]}"
    run_case $layout $np $r checkpoint-write throw 5 "error (rank $r): injected fault at checkpoint-write" "${set[@]}"
    run_case $layout $np $r eval throw 1 "error (rank $r): injected fault at eval" "${set[@]}"
  fi
  run_case $layout $np $r collective throw 9 "error (rank $r): injected fault at collective" "${set[@]}"
  # The other kinds of failure.
  run_case $layout $np $r backward oom 2 "error (rank $r): out of memory" "${set[@]}"
  run_case $layout $np $r collective kill 9 "injected fault at collective (rank $r, occurrence 9): killing" "${set[@]}"
  run_case $layout $np $r forward hang 3 "made no progress (runtime.timeout_s exceeded)" "${set[@]}"
  # No checkpoint was published by a failed write; nothing half-written carries a final name.
  rm -rf ck
done
# The checkpoint-write failure left no complete-looking file behind.
run_case pp2 2 1 checkpoint-write kill 5 "killing the process" --set parallel.pp=2
test ! -e ck/step_00000001.h5 || die "a killed checkpoint write published ck/step_00000001.h5"

echo "time from launch to the end of the job (2 cores, ranks oversubscribed):"
printf '  %s\n' "${report[@]}"
echo "fault injection checks passed"
