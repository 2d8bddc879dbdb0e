#!/usr/bin/env bash
# End to end: text -> HDF5 tokens -> a short training run whose loss clearly falls,
# with the metrics file holding one JSON object per step with the documented keys.
set -euo pipefail
: "${PIPETRAIN:?}" "${SRC:?}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

head -c 300000 "$SRC/inputs/austen.txt" >"$tmp/corpus.txt"
timeout 120 "$PIPETRAIN" data text "$tmp/corpus.txt" -o "$tmp/corpus.h5"

timeout 600 "$PIPETRAIN" train "$SRC/inputs/austen-char.toml" \
  --set data.train="$tmp/corpus.h5" --set train.steps=80 --set model.n_layer=2 \
  --set model.d_model=64 --set train.seq_len=64 --set model.max_seq_len=64 \
  --set train.warmup_steps=5 --set log.every=20 --metrics "$tmp/metrics.jsonl" | tee "$tmp/out.txt"

grep -q "step    79/80" "$tmp/out.txt"
python3 - "$tmp/metrics.jsonl" <<'PY'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["step"] for r in rows] == list(range(80)), "one row per step"
for r in rows:
    assert {"step", "loss", "lr", "grad_norm", "tokens_per_s", "step_time_s", "bubble_fraction",
            "tokens", "flops_per_s", "peak_mem_bytes", "reserved_mem_bytes"} <= set(r), r
    assert all(math.isfinite(r[k]) for k in r), r
first = rows[0]["loss"]
last = sum(r["loss"] for r in rows[-10:]) / 10
assert abs(first - math.log(256)) < 0.3, f"first loss {first} should be near ln(256)"
assert last < first - 2.0, f"loss did not fall enough: {first} -> {last}"
print(f"loss {first:.3f} -> {last:.3f}")
PY

# runtime.dense_products and runtime.pack_weights = "auto" (the defaults) say in the header
# what they chose and why: a d_model 512 model is timed at start-up (the times kept in the
# checkpoint directory, read back by the next run, which then chooses alike); the backend
# line names packed products exactly when the choice packed some; set false, nothing is
# packed; below d_model 512 nothing is timed.
auto_run() {
  timeout 300 "$PIPETRAIN" train "$SRC/inputs/austen-char.toml" \
    --set data.train="$tmp/corpus.h5" --set train.steps=1 --set model.n_layer=1 --set model.n_head=8 \
    --set model.d_model=512 --set train.seq_len=64 --set model.max_seq_len=64 --set train.global_batch=4 \
    --set train.microbatches=2 --set checkpoint.dir="$tmp/ck" "$@"
}
auto_run >"$tmp/auto.txt"
grep -q "(dense products: .*(times timed here in " "$tmp/auto.txt" || { echo "FAIL: no timed choice: $(cat "$tmp/auto.txt")"; exit 1; }
[ -s "$tmp/ck/dense_product_times.json" ] || { echo "FAIL: the times were not kept"; exit 1; }
choice() { grep -o '(dense products: .*(times' "$1"; }
if choice "$tmp/auto.txt" | grep -q "; packed "; then
  grep -q 'dense products by weights packed for' "$tmp/auto.txt"
elif grep -q 'dense products by weights packed for' "$tmp/auto.txt"; then
  echo "FAIL: auto chose not to pack, yet packed"; exit 1
fi
auto_run >"$tmp/again.txt"
grep -q "(times from $tmp/ck/dense_product_times.json)" "$tmp/again.txt" || { echo "FAIL: the kept times were not read: $(cat "$tmp/again.txt")"; exit 1; }
[ "$(choice "$tmp/auto.txt")" = "$(choice "$tmp/again.txt")" ] || { echo "FAIL: the restarted run chose otherwise"; exit 1; }
auto_run --set runtime.pack_weights=false >"$tmp/off.txt"
if grep -q 'dense products by weights packed for' "$tmp/off.txt"; then echo "FAIL: pack_weights=false still packed"; exit 1; fi
if choice "$tmp/off.txt" | grep -q "; packed "; then echo "FAIL: pack_weights=false reports packing"; exit 1; fi
auto_run --set model.d_model=256 >"$tmp/small.txt"
grep -q "(dense products: BLAS: d_model 256 < 512, too small to time" "$tmp/small.txt"
choice "$tmp/auto.txt"

# Mixture of experts (inputs/moe-demo.toml, smaller): the header names the experts, the loss
# falls, and each step's metrics carry the auxiliary losses and one load per MoE block
# (3 of 4 blocks: the first is dense), each at least 1 (the busiest expert over the mean);
# with a capacity factor of 1, the share of choices dropped per block (some, early on).
timeout 300 "$PIPETRAIN" train "$SRC/inputs/moe-demo.toml" --set data.train="$tmp/corpus.h5" \
  --set train.steps=12 --set model.d_model=64 --set train.seq_len=32 --set model.max_seq_len=32 \
  --set model.expert_ffn_hidden=32 --set train.warmup_steps=2 --set log.every=100 --set model.capacity_factor=1 \
  --metrics "$tmp/moe.jsonl" >"$tmp/moe.out"
grep -q "3 of 4 blocks a mixture of 8 experts" "$tmp/moe.out" || { cat "$tmp/moe.out"; exit 1; }
python3 - "$tmp/moe.jsonl" <<'PY'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for r in rows:
    assert len(r["moe_max_load"]) == 3 and all(1 <= x <= 8 for x in r["moe_max_load"]), r
    assert r["moe_load_balance_loss"] > 0 and r["moe_z_loss"] > 0, r
    assert len(r["moe_dropped"]) == 3 and all(0 <= x < 1 for x in r["moe_dropped"]), r
assert any(x > 0 for x in rows[0]["moe_dropped"]), rows[0]
assert rows[-1]["loss"] < rows[0]["loss"] - 0.5, [r["loss"] for r in rows]
print(f"mixture of experts: loss {rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f}, "
      f"load {rows[0]['moe_max_load']} -> {rows[-1]['moe_max_load']}, dropped {rows[0]['moe_dropped']}")
PY
