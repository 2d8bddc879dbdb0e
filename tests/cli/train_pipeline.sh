#!/usr/bin/env bash
# The `pipetrain train` command on a 2-stage pipeline (1f1b and zbv), on 2 data-parallel
# replicas and on 2 tensor-parallel ranks gives the single-rank run's losses, and --trace writes one Chrome trace for all ranks.
set -euo pipefail
: "${PIPETRAIN:?}" "${SRC:?}" "${MPIEXEC:?}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
head -c 200000 "$SRC/inputs/austen.txt" >"$tmp/corpus.txt"
"$PIPETRAIN" data text "$tmp/corpus.txt" -o "$tmp/corpus.h5" >/dev/null
common=(--set data.train="$tmp/corpus.h5" --set train.steps=6 --set model.d_model=64
        --set train.seq_len=32 --set model.max_seq_len=32 --set train.microbatches=4
        --set train.global_batch=8 --set log.every=100 --set data.val="$tmp/corpus.h5"
        --set train.eval_every=3 --set train.eval_batches=2)

timeout 300 "$PIPETRAIN" train "$SRC/inputs/austen-char.toml" "${common[@]}" \
  --metrics "$tmp/single.jsonl" >/dev/null
timeout 300 "$MPIEXEC" -np 2 "$PIPETRAIN" train "$SRC/inputs/austen-char.toml" "${common[@]}" \
  --set parallel.pp=2 --metrics "$tmp/pp2.jsonl" --trace "$tmp/trace" >"$tmp/pp2.out"
# The header says what the split costs: the schedule simulated with the stages' measured
# costs against stages of equal cost (with 4 microbatches on 2 stages no split beats equal
# stages; with 2 a heavier first stage can, by hiding the second's backward).
python3 - "$tmp/pp2.out" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r"split: blocks per stage \[([\d.]+), ([\d.]+)\].*simulated with these costs: bubble ([\d.]+)%, step ([\d.]+) x", text)
assert m, "no split line in the header:\n" + text[:2000]
assert float(m.group(1)) + float(m.group(2)) == 4, m.group(0)  # whole or half blocks
assert 0 < float(m.group(3)) < 100 and 0.999 <= float(m.group(4)) < 3, m.group(0)
PY
timeout 300 "$MPIEXEC" -np 2 "$PIPETRAIN" train "$SRC/inputs/austen-char.toml" "${common[@]}" \
  --set parallel.pp=2 --set parallel.virtual_stages=2 --set schedule.name=zbv \
  --metrics "$tmp/zbv.jsonl" >/dev/null
timeout 300 "$MPIEXEC" -np 2 "$PIPETRAIN" train "$SRC/inputs/austen-char.toml" "${common[@]}" \
  --set parallel.dp=2 --set train.microbatches=2 --metrics "$tmp/dp2.jsonl" >/dev/null

timeout 300 "$MPIEXEC" -np 2 "$PIPETRAIN" train "$SRC/inputs/austen-char.toml" "${common[@]}" \
  --set parallel.tp=2 --metrics "$tmp/tp2.jsonl" >/dev/null

python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
load = lambda n: [json.loads(l) for l in open(f"{d}/{n}.jsonl")]
ref = load("single")
for name in ("pp2", "zbv", "dp2", "tp2"):
    got = load(name)
    assert len(got) == len(ref) == 6, name
    for a, b in zip(got, ref):
        rel = abs(a["loss"] - b["loss"]) / b["loss"]
        assert rel < 1e-5, f"{name} step {a['step']}: {a['loss']} vs {b['loss']}"
        assert 0.0 <= a["bubble_fraction"] < 1.0
        assert ("val_loss" in a) == (a["step"] in (2, 5)) == ("val_loss" in b), (a, b)
        if "val_loss" in a:
            assert abs(a["val_loss"] - b["val_loss"]) / b["val_loss"] < 1e-5, (name, a, b)
    print(f"{name}: losses match the single-rank run")
trace = json.load(open(f"{d}/trace/trace.json"))
pids = {e["pid"] for e in trace["traceEvents"] if e.get("ph") == "X"}
assert pids == {0, 1}, pids
names = {e["name"] for e in trace["traceEvents"] if e.get("ph") == "X"}
assert {"0F0", "1F0", "0B0", "1B0"} <= names, names
print("trace: both ranks, F and B actions")
PY

# Vocabulary parallelism with GPT-2's vocabulary on a small model (the tables outweigh the
# blocks): the header's estimate is within the issue's 10% of the largest rank's measured
# peak (pool and packed copies), and the split table lowers that peak against whole layers on the end stages.
# Weights packed where the CPU can (oneDNN): the copies are on both sides, and the slice's
# copies, not the whole head's, are the last rank's.
vocab=(--set model.vocab_size=50257 --set model.n_layer=2 --set train.steps=2 --set train.eval_every=0
       --set runtime.pack_weights=true)
for vp in false true; do
  run=(timeout 300 "$MPIEXEC" -np 2 "$PIPETRAIN" train "$SRC/inputs/austen-char.toml" "${common[@]}" "${vocab[@]}"
       --set parallel.pp=2 --set "parallel.vocab_parallel=$vp" --metrics "$tmp/v-$vp.jsonl")
  if ! "${run[@]}" >"$tmp/v-$vp.out" 2>&1; then
    grep -q "cannot keep weights" "$tmp/v-$vp.out" || { cat "$tmp/v-$vp.out"; exit 1; }
    echo "note: this CPU cannot pack weights; memory checked without packed copies"
    "${run[@]}" --set runtime.pack_weights=false >"$tmp/v-$vp.out"
  fi
done
python3 - "$tmp" <<'PY'
import json, re, sys
d = sys.argv[1]
def read(vp):
    est = float(re.search(r"memory estimate (\d+) MiB", open(f"{d}/v-{vp}.out").read()).group(1))
    peak = max(json.loads(l)["peak_mem_bytes"] for l in open(f"{d}/v-{vp}.jsonl")) / 2**20
    return est, peak
(ew, pw), (ev, pv) = read("false"), read("true")
assert abs(ev - pv) <= 0.1 * pv, f"vocabulary parallel: estimate {ev} MiB, measured {pv:.1f} MiB"
assert pv < 0.85 * pw, f"the split vocabulary did not lower the largest rank's peak: {pv:.1f} vs {pw:.1f} MiB"
print(f"memory: whole layers {pw:.1f} MiB (estimate {ew:.0f}); vocabulary parallel {pv:.1f} MiB (estimate {ev:.0f})")
PY
