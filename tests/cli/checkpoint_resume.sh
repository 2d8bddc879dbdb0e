#!/usr/bin/env bash
# Checkpoints: bitwise resume on the same grid, resume on other grids (GPT-2 and Llama), fallback past a
# corrupt checkpoint, survival of a rank killed mid-write, SIGUSR1 to the launcher, and
# clear errors for wrong shapes, missing and non-HDF5 files.
set -euo pipefail
: "${PIPETRAIN:?}" "${SRC:?}" "${MPIEXEC:?}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
source "$SRC/tests/cli/lib/expect.sh"
head -c 200000 "$SRC/inputs/austen.txt" >corpus.txt
"$PIPETRAIN" data text corpus.txt -o corpus.h5 >/dev/null
cfg=(train "$SRC/inputs/austen-char.toml" --set data.train=corpus.h5 --set train.steps=6
     --set model.n_layer=2 --set model.d_model=64 --set train.seq_len=32 --set model.max_seq_len=32
     --set train.microbatches=2 --set train.global_batch=8 --set log.every=100)
losses() { python3 -c "import json,sys; print(' '.join(repr(json.loads(l)['loss']) for l in open(sys.argv[1])))" "$1"; }
# same_losses REF.jsonl GOT.jsonl TOLERANCE WHAT [FIRST_TOLERANCE]: GOT holds steps 3, 4, 5
# and each loss is REF's at that step within TOLERANCE (relative; 0 = bitwise); step 3, the
# first after the resume, within FIRST_TOLERANCE when given, and then REF must have moved
# from its step-0 loss by more than twice that, so a resume that re-initialised the weights
# (a step-0-like loss) cannot pass.
same_losses() {
  python3 - "$@" <<'PY'
import json, sys
ref = [json.loads(l)["loss"] for l in open(sys.argv[1])]
got = [json.loads(l) for l in open(sys.argv[2])]
tol, what = float(sys.argv[3]), sys.argv[4]
first = float(sys.argv[5]) if len(sys.argv) > 5 else tol
assert [g["step"] for g in got] == [3, 4, 5], (what, got)
if len(sys.argv) > 5:
    moved = abs(ref[3] - ref[0]) / ref[3]
    assert moved > 2 * first, f"{what}: the reference moved {moved:.3f} by step 3: no test of the resume"
for g in got:
    rel = abs(g["loss"] - ref[g["step"]]) / ref[g["step"]]
    bound = first if g["step"] == 3 else tol
    assert rel <= bound, f"{what}: step {g['step']}: {g['loss']} vs {ref[g['step']]} ({rel:.4f} > {bound})"
print(f"   {what}: losses match")
PY
}

echo "== uninterrupted single-rank run, checkpoints every 3 steps"
timeout 300 "$PIPETRAIN" "${cfg[@]}" --set checkpoint.dir=full --set checkpoint.every=3 --metrics full.jsonl >/dev/null
test -f full/step_00000003.h5
test -f full/step_00000006.h5
grep -qx step_00000006.h5 full/latest

echo "== resume from step 3 on the same grid: bitwise equal losses and parameters"
mkdir res
cp full/step_00000003.h5 res/
timeout 300 "$PIPETRAIN" "${cfg[@]}" --set checkpoint.dir=res --set checkpoint.every=3 --resume res/step_00000003.h5 \
  --metrics res.jsonl >res.out
grep -q "resumed from res/step_00000003.h5 at step 3" res.out
same_losses full.jsonl res.jsonl 0 "resumed on the same grid"
h5diff full/step_00000006.h5 res/step_00000006.h5 /params /params
h5diff full/step_00000006.h5 res/step_00000006.h5 /adam_m /adam_m
h5diff full/step_00000006.h5 res/step_00000006.h5 /adam_v /adam_v

echo "== precision: an fp32 checkpoint resumes in bf16, a bf16 one in fp32 (the file holds fp32 master weights)"
# Tolerances (n_layer = 2): the first step after the resume is one forward of the same
# weights in the other precision, within (9 n_layer + 4) 2^-8 = 0.086 relative (one bf16
# rounding, 2^-8, per operation of the forward's chain); the later ones within the bf16
# training bound of tests/test_mixed_precision.cpp, 2 (9 n_layer + 4) 2^-8 = 0.17. With no
# warm-up and lr 1e-2 the loss has fallen by 30% at step 3, so a re-initialised model fails.
fast=(--set train.warmup_steps=0 --set train.lr=1e-2)
timeout 300 "$PIPETRAIN" "${cfg[@]}" "${fast[@]}" --set checkpoint.dir=f32 --set checkpoint.every=3 --metrics f32.jsonl >/dev/null
timeout 300 "$PIPETRAIN" "${cfg[@]}" "${fast[@]}" --set checkpoint.dir=b16 --set checkpoint.every=3 \
  --set train.precision=bf16 --metrics b16.jsonl >/dev/null
rm -f p.jsonl
timeout 300 "$PIPETRAIN" "${cfg[@]}" "${fast[@]}" --set train.precision=bf16 --resume f32/step_00000003.h5 \
  --metrics p.jsonl >/dev/null
same_losses f32.jsonl p.jsonl 0.17 "fp32 checkpoint resumed in bf16" 0.086
rm -f p.jsonl
timeout 300 "$PIPETRAIN" "${cfg[@]}" "${fast[@]}" --resume b16/step_00000003.h5 --metrics p.jsonl >/dev/null
same_losses b16.jsonl p.jsonl 0.17 "bf16 checkpoint resumed in fp32" 0.086
rm -f p.jsonl
timeout 300 "$PIPETRAIN" "${cfg[@]}" "${fast[@]}" --set train.precision=bf16 --resume b16/step_00000003.h5 \
  --metrics p.jsonl >/dev/null
same_losses b16.jsonl p.jsonl 0 "bf16 checkpoint resumed in bf16 (bitwise)"

echo "== save on pp=2, resume on tp=2, dp=2, cp=2 and a single rank; save on cp=2, resume on a single rank"
timeout 300 "$MPIEXEC" -np 2 "$PIPETRAIN" "${cfg[@]}" --set parallel.pp=2 --set checkpoint.dir=pp2 \
  --set checkpoint.every=3 --metrics pp2.jsonl >/dev/null
timeout 300 "$MPIEXEC" -np 2 "$PIPETRAIN" "${cfg[@]}" --set parallel.cp=2 --set checkpoint.dir=cp2 \
  --set checkpoint.every=3 --metrics cp2.jsonl >/dev/null
for grid in "2 parallel.tp=2" "2 parallel.dp=2" "2 parallel.cp=2" "1 parallel.tp=1" "1 checkpoint.dir=cp2"; do
  read -r -a args <<<"$grid"; set -- "${args[@]}"
  rm -f g.jsonl
  from=pp2
  if [ "$2" = checkpoint.dir=cp2 ]; then from=cp2; fi
  timeout 300 "$MPIEXEC" -np "$1" "$PIPETRAIN" "${cfg[@]}" --set checkpoint.dir=$from --set "$2" \
    --resume $from/step_00000003.h5 --metrics g.jsonl >/dev/null
  same_losses full.jsonl g.jsonl 1e-5 "resumed on $2 (saved in $from)"
done

echo "== vocabulary parallelism: saved with the vocabulary split over pp=2, resumed whole; and the reverse"
# The same sums in the same order (each row of the table from one slice, the softmax's
# statistics combined in float64): the losses match as across grids above.
timeout 300 "$MPIEXEC" -np 2 "$PIPETRAIN" "${cfg[@]}" --set parallel.pp=2 --set parallel.vocab_parallel=true \
  --set checkpoint.dir=vp --set checkpoint.every=3 --metrics vp.jsonl >/dev/null
same_losses full.jsonl <(tail -n 3 vp.jsonl) 1e-5 "vocabulary parallel against whole"
rm -f g.jsonl
timeout 300 "$MPIEXEC" -np 2 "$PIPETRAIN" "${cfg[@]}" --set parallel.pp=2 --set checkpoint.dir=vp \
  --resume vp/step_00000003.h5 --metrics g.jsonl >/dev/null
same_losses full.jsonl g.jsonl 1e-5 "split vocabulary resumed whole"
rm -f g.jsonl
timeout 300 "$MPIEXEC" -np 2 "$PIPETRAIN" "${cfg[@]}" --set parallel.pp=2 --set parallel.vocab_parallel=true \
  --set checkpoint.dir=pp2 --resume pp2/step_00000003.h5 --metrics g.jsonl >/dev/null
same_losses full.jsonl g.jsonl 1e-5 "whole vocabulary resumed split"

echo "== a blend (two weighted sources, shuffled): saved on one rank, resumed on dp=2, continues the exact stream"
tail -c 150000 "$SRC/inputs/austen.txt" >second.txt
"$PIPETRAIN" data text second.txt -o second.h5 >/dev/null
blend=(--set 'data.train=[{path = "corpus.h5", weight = 2}, {path = "second.h5", weight = 1}]' --set data.sampling=shuffle)
timeout 300 "$PIPETRAIN" "${cfg[@]}" "${blend[@]}" --set checkpoint.dir=bfull --set checkpoint.every=3 \
  --metrics bfull.jsonl >/dev/null
rm -f g.jsonl
timeout 300 "$MPIEXEC" -np 2 "$PIPETRAIN" "${cfg[@]}" "${blend[@]}" --set parallel.dp=2 --set checkpoint.dir=bfull \
  --resume bfull/step_00000003.h5 --metrics g.jsonl >/dev/null
same_losses bfull.jsonl g.jsonl 1e-5 "blend resumed on parallel.dp=2"
python3 - bfull.jsonl full.jsonl <<'PY'
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:3])
assert a != b, "the blend drew the same samples as the single source"
PY

echo "== Llama: save on tp=2 (key/value heads split), resume on pp=2 and on a single rank"
llama=(train "$SRC/inputs/llama-demo.toml" --set data.train=corpus.h5 --set train.steps=6 --set model.n_layer=2
       --set model.d_model=64 --set model.ffn_hidden=96 --set train.seq_len=32 --set model.max_seq_len=32
       --set train.microbatches=2 --set train.global_batch=8 --set log.every=100 --set log.progress=false)
timeout 300 "$PIPETRAIN" "${llama[@]}" --set checkpoint.dir=lfull --metrics lfull.jsonl >/dev/null
timeout 300 "$MPIEXEC" -np 2 "$PIPETRAIN" "${llama[@]}" --set parallel.tp=2 --set checkpoint.dir=ltp \
  --set checkpoint.every=3 --metrics ltp.jsonl >/dev/null
for grid in "2 parallel.pp=2" "1 parallel.tp=1"; do
  read -r -a args <<<"$grid"; set -- "${args[@]}"
  rm -f g.jsonl
  timeout 300 "$MPIEXEC" -np "$1" "$PIPETRAIN" "${llama[@]}" --set "$2" --set checkpoint.dir=ltp \
    --resume ltp/step_00000003.h5 --metrics g.jsonl >/dev/null
  same_losses lfull.jsonl g.jsonl 1e-5 "Llama resumed on $2"
done

echo "== Mixture of experts: save on dp=2 with ep=2 (each rank writes its experts' rows), resume on ep=1, one rank"
# With the selection bias (router_bias_rate): state no optimizer touches, saved with the weights.
# One rank runs both replicas' microbatches (the load-balancing loss is a microbatch's).
moe=(train "$SRC/inputs/moe-demo.toml" --set data.train=corpus.h5 --set train.steps=6 --set model.n_layer=2
     --set model.d_model=64 --set model.expert_ffn_hidden=32 --set train.seq_len=32 --set model.max_seq_len=32
     --set train.global_batch=8 --set log.every=100 --set log.progress=false --set model.router_bias_rate=0.05)
timeout 300 "$MPIEXEC" -np 2 "$PIPETRAIN" "${moe[@]}" --set parallel.dp=2 --set parallel.ep=2 \
  --set train.microbatches=2 --set checkpoint.dir=mep --set checkpoint.every=3 --metrics mep.jsonl >/dev/null
mkdir mres
cp mep/step_00000003.h5 mres/
timeout 300 "$MPIEXEC" -np 2 "$PIPETRAIN" "${moe[@]}" --set parallel.dp=2 --set parallel.ep=2 \
  --set train.microbatches=2 --set checkpoint.dir=mres --set checkpoint.every=3 --resume mres/step_00000003.h5 \
  --metrics mres.jsonl >/dev/null
same_losses mep.jsonl mres.jsonl 0 "mixture of experts resumed on the same grid"
h5diff mep/step_00000006.h5 mres/step_00000006.h5 /params /params  # the selection bias too, bitwise
# Last, tp = 2 beside ep = 2: each rank reads its tp columns of its experts' rows (under
# ZeRO-1, its slice of those for the moments).
for grid in "2 2 parallel.dp=2" "1 4 parallel.dp=1" "4 2 parallel.dp=2 parallel.tp=2 parallel.ep=2" \
  "4 2 parallel.dp=2 parallel.tp=2 parallel.ep=2 parallel.zero1=true"; do
  read -r np mb rest <<<"$grid"
  sets=()
  for s in $rest; do sets+=(--set "$s"); done
  rm -f g.jsonl
  timeout 300 "$MPIEXEC" -np "$np" "$PIPETRAIN" "${moe[@]}" "${sets[@]}" --set train.microbatches="$mb" \
    --set checkpoint.dir=mep --resume mep/step_00000003.h5 --metrics g.jsonl >/dev/null
  same_losses mep.jsonl g.jsonl 1e-5 "mixture of experts resumed on $rest"
done
echo "== Mixture of experts: save on dp=2 x tp=2 with ep=2 (the 2-D expert shards), resume on one rank"
timeout 300 "$MPIEXEC" -np 4 "$PIPETRAIN" "${moe[@]}" --set parallel.dp=2 --set parallel.tp=2 --set parallel.ep=2 \
  --set train.microbatches=2 --set checkpoint.dir=mtp --set checkpoint.every=3 >/dev/null
rm -f g.jsonl
timeout 300 "$MPIEXEC" -np 1 "$PIPETRAIN" "${moe[@]}" --set train.microbatches=4 --set checkpoint.dir=mtp \
  --resume mtp/step_00000003.h5 --metrics g.jsonl >/dev/null
same_losses mep.jsonl g.jsonl 1e-5 "mixture of experts saved on tp=2 with ep=2, resumed on one rank"

echo "== Mixture of experts under ZeRO-1 on dp=4 with ep=2: two ranks share each expert's moments"
zep=(--set parallel.dp=4 --set parallel.ep=2 --set parallel.zero1=true --set train.microbatches=1)
timeout 300 "$MPIEXEC" -np 4 "$PIPETRAIN" "${moe[@]}" "${zep[@]}" --set checkpoint.dir=mz --set checkpoint.every=3 \
  --metrics mz.jsonl >/dev/null
mkdir mzres
cp mz/step_00000003.h5 mzres/
PIPETRAIN_STAGE_CHECKPOINTS=1 timeout 300 "$MPIEXEC" -np 4 "$PIPETRAIN" "${moe[@]}" "${zep[@]}" --set checkpoint.dir=mzres \
  --set checkpoint.every=3 --resume mzres/step_00000003.h5 --metrics mzres.jsonl >/dev/null
same_losses mz.jsonl mzres.jsonl 0 "mixture of experts under ZeRO-1 resumed on the same grid"
for group in /adam_m /adam_v /params; do h5diff mz/step_00000006.h5 mzres/step_00000006.h5 $group $group; done
# Across the boundary both ways: its slices resumed on one rank; ep=2 without ZeRO-1 resumed in slices.
rm -f g.jsonl
timeout 300 "$MPIEXEC" -np 1 "$PIPETRAIN" "${moe[@]}" --set train.microbatches=4 --set checkpoint.dir=zx \
  --resume mz/step_00000003.h5 --metrics g.jsonl >/dev/null
same_losses mz.jsonl g.jsonl 1e-5 "mixture of experts saved under ZeRO-1 with ep=2, resumed on one rank"
rm -f g.jsonl
timeout 300 "$MPIEXEC" -np 4 "$PIPETRAIN" "${moe[@]}" "${zep[@]}" --set checkpoint.dir=zx --resume mep/step_00000003.h5 \
  --metrics g.jsonl >/dev/null
same_losses mep.jsonl g.jsonl 1e-5 "mixture of experts saved with ep=2, resumed under ZeRO-1 on dp=4"

echo "== ZeRO-1 on dp=2: each rank writes and reads only its slice of the moments"
z1=(--set parallel.dp=2 --set parallel.zero1=true)
timeout 300 "$MPIEXEC" -np 2 "$PIPETRAIN" "${cfg[@]}" "${z1[@]}" --set checkpoint.dir=z1 --set checkpoint.every=3 \
  --metrics z1.jsonl >/dev/null
mkdir z1res
cp z1/step_00000003.h5 z1res/
# The resumed run (and the tp = 2 one below) stage every tensor through host buffers, as
# GPU runs do: the files must come out bitwise the same.
PIPETRAIN_STAGE_CHECKPOINTS=1 timeout 300 "$MPIEXEC" -np 2 "$PIPETRAIN" "${cfg[@]}" "${z1[@]}" --set checkpoint.dir=z1res --set checkpoint.every=3 \
  --resume z1res/step_00000003.h5 --metrics z1res.jsonl >/dev/null
same_losses z1.jsonl z1res.jsonl 0 "ZeRO-1 resumed on the same grid"
# Bitwise the same file as the uninterrupted ZeRO-1 run, moments included.
h5diff z1/step_00000006.h5 z1res/step_00000006.h5 /adam_m /adam_m
h5diff z1/step_00000006.h5 z1res/step_00000006.h5 /adam_v /adam_v
h5diff z1/step_00000006.h5 z1res/step_00000006.h5 /params /params
# With tp = 2 as well, the dp slices cut through tensor-parallel blocks (QKV's three).
PIPETRAIN_STAGE_CHECKPOINTS=1 timeout 300 "$MPIEXEC" -np 4 "$PIPETRAIN" "${cfg[@]}" "${z1[@]}" --set parallel.tp=2 --set checkpoint.dir=z1tp \
  --set checkpoint.every=3 --metrics z1tp.jsonl >/dev/null
# Across the ZeRO boundary both ways: the file does not depend on it.
for run in "1 z1/step_00000003.h5 z1.jsonl" "2 full/step_00000003.h5 full.jsonl" "1 z1tp/step_00000003.h5 z1tp.jsonl"; do
  read -r -a args <<<"$run"; set -- "${args[@]}"
  rm -f g.jsonl
  extra=()
  if [ "$1" = 2 ]; then extra=("${z1[@]}"); fi
  PIPETRAIN_STAGE_CHECKPOINTS=1 timeout 300 "$MPIEXEC" -np "$1" "$PIPETRAIN" "${cfg[@]}" "${extra[@]}" --set checkpoint.dir=zx --resume "$2" \
    --metrics g.jsonl >/dev/null
  same_losses "$3" g.jsonl 1e-5 "resumed $2 across the ZeRO-1 boundary"
done

echo "== a corrupt newest checkpoint: --resume auto falls back to the previous one"
mkdir bad
cp full/step_00000003.h5 full/step_00000006.h5 bad/
python3 - <<'PY'
import os
p = "bad/step_00000006.h5"
size = os.path.getsize(p)
with open(p, "r+b") as f:
    f.seek(int(size * 0.6))
    f.write(b"\xff" * 4096)
PY
timeout 300 "$PIPETRAIN" "${cfg[@]}" --set checkpoint.dir=bad --set train.steps=7 --resume auto >auto.out 2>auto.err
grep -q "skipping checkpoint bad/step_00000006.h5" auto.err
grep -q "resumed from bad/step_00000003.h5 at step 3" auto.out
# The same on pp = 2: the ranks verify their own shares and agree on the fallback.
timeout 300 "$MPIEXEC" -np 2 "$PIPETRAIN" "${cfg[@]}" --set parallel.pp=2 --set checkpoint.dir=bad --set train.steps=7 \
  --resume auto >auto2.out 2>auto2.err
grep -q "skipping checkpoint bad/step_00000006.h5: .*(rank [01])" auto2.err
grep -q "resumed from bad/step_00000003.h5 at step 3" auto2.out

echo "== kill -9 one rank while a checkpoint is written: the previous one survives"
mkdir crash
cp full/step_00000003.h5 crash/
echo step_00000003.h5 >crash/latest
set +e
# Rank 1 is killed half-way through the step-6 checkpoint: tensor 42 of 3 x 28 (2 layers).
PIPETRAIN_FAULT=1:checkpoint-write:kill:42 timeout 300 "$MPIEXEC" -np 2 -x PIPETRAIN_FAULT \
  "$PIPETRAIN" "${cfg[@]}" --set parallel.pp=2 --set checkpoint.dir=crash --set checkpoint.every=3 \
  --resume crash/step_00000003.h5 >crash.out 2>&1
rc=$?
set -e
test "$rc" -ne 0
test ! -f crash/step_00000006.h5
grep -qx step_00000003.h5 crash/latest
timeout 300 "$PIPETRAIN" "${cfg[@]}" --set checkpoint.dir=crash --resume auto >crash2.out
grep -q "resumed from crash/step_00000003.h5" crash2.out

echo "== SIGUSR1 to the launcher: checkpoint, exit 0, and the resumed run continues the curve"
# A constant learning rate: the stopped run (train.steps = 100000), the resumed one and the
# uninterrupted reference then share every step's rate.
sig=(--set parallel.pp=2 --set train.lr_schedule=constant)
"$MPIEXEC" -np 2 "$PIPETRAIN" "${cfg[@]}" "${sig[@]}" --set train.steps=100000 --set log.every=1 \
  --set checkpoint.dir=sig --metrics sig.jsonl >sig.out 2>&1 &
pid=$!
for _ in $(seq 600); do if grep -q "step     2/" sig.out 2>/dev/null; then break; fi; sleep 0.1; done
kill -USR1 "$pid"
wait "$pid"
grep -q "saved checkpoint sig/step_" sig.out
grep -q "stopping after step" sig.out
ls sig/step_*.h5 >/dev/null
stopped=$(python3 -c "import json; print(sum(1 for _ in open('sig.jsonl')))")
timeout 300 "$MPIEXEC" -np 2 "$PIPETRAIN" "${cfg[@]}" "${sig[@]}" --set train.steps=$((stopped + 2)) \
  --set checkpoint.dir=sig --resume auto --metrics sig.jsonl >/dev/null
timeout 300 "$MPIEXEC" -np 2 "$PIPETRAIN" "${cfg[@]}" "${sig[@]}" --set train.steps=$((stopped + 2)) \
  --set checkpoint.every=0 --metrics sig-ref.jsonl >/dev/null
python3 - "$stopped" <<'PY'
import json, sys
rows = [json.loads(l) for l in open("sig.jsonl")]
ref = [json.loads(l) for l in open("sig-ref.jsonl")]
n = int(sys.argv[1])
assert [r["step"] for r in rows] == list(range(n + 2)), [r["step"] for r in rows]
# A resume is bitwise: every loss, before the signal and after the resume, the uninterrupted run's.
assert [r["loss"] for r in rows] == [r["loss"] for r in ref], ([r["loss"] for r in rows], [r["loss"] for r in ref])
print(f"   stopped after {n} steps, resumed for 2 more: every loss the uninterrupted run's")
PY

echo "== bad checkpoints give one error line and a non-zero exit"
expect_failure "params/wpe" "$PIPETRAIN" "${cfg[@]}" --set model.max_seq_len=64 --resume full/step_00000003.h5
expect_failure "nope.h5: no such checkpoint file" "$PIPETRAIN" "${cfg[@]}" --resume nope.h5
expect_failure "corpus.txt: not an HDF5 file" "$PIPETRAIN" "${cfg[@]}" --resume corpus.txt
echo "all checkpoint checks passed"
