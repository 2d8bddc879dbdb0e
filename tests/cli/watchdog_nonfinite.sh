#!/usr/bin/env bash
# The hang watchdog ends a stuck job with every stuck rank saying where it is, and a
# non-finite loss stops the run naming the step (or skips the update when asked).
set -euo pipefail
: "${PIPETRAIN:?}" "${SRC:?}" "${MPIEXEC:?}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
head -c 100000 "$SRC/inputs/austen.txt" >c.txt
"$PIPETRAIN" data text c.txt -o c.h5 >/dev/null
cfg=(train "$SRC/inputs/austen-char.toml" --set data.train=c.h5 --set model.n_layer=2 --set model.d_model=64
     --set train.seq_len=32 --set model.max_seq_len=32 --set train.steps=5 --set log.every=1)

echo "== rank 1 stops making progress: the watchdog reports and the job ends non-zero"
set +e
# Rank 1 hangs at its first forward of step 1 (each step runs train.microbatches = 2 forwards).
PIPETRAIN_FAULT=1:forward:hang:3 timeout 120 "$MPIEXEC" -np 2 -x PIPETRAIN_FAULT "$PIPETRAIN" "${cfg[@]}" \
  --set parallel.pp=2 --set runtime.timeout_s=3 >hang.out 2>hang.err
rc=$?
set -e
grep pipetrain hang.err || true
if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then echo "FAIL: the hung job exited $rc (want a non-zero exit before the 120 s timeout)"; exit 1; fi
grep -q "pipetrain: rank 0 made no progress (runtime.timeout_s exceeded): at step 1, instruction" hang.err
grep -q "waiting 3 s for message" hang.err

echo "== a non-finite loss stops the run and names the step"
if timeout 120 "$PIPETRAIN" "${cfg[@]}" --set train.lr=1e30 --set train.min_lr=0 --set train.grad_clip=0 \
   --set train.warmup_steps=0 >nan.out 2>nan.err; then
  echo "expected a failure"; exit 1
fi
grep -q "pipetrain: error: step [0-9]*: non-finite" nan.err

echo "== with runtime.on_nonfinite = skip the run goes on and says so"
timeout 120 "$PIPETRAIN" "${cfg[@]}" --set train.lr=1e30 --set train.min_lr=0 --set train.grad_clip=0 \
  --set train.warmup_steps=0 --set runtime.on_nonfinite=skip --set checkpoint.dir=ck --set checkpoint.every=0 >skip.out
grep -q "update skipped" skip.out
echo "watchdog and non-finite checks passed"
