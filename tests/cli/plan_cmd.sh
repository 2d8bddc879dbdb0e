#!/usr/bin/env bash
# `pipetrain plan`: ranks layouts of the shipped configs on the shipped clusters (text and
# JSON; GPT-3 175B on 1024 GPUs), refuses bad cluster files, models that fit nowhere and
# device counts no grid divides with one line each; `--calibrate` under mpirun writes a
# cluster file that plans and `train --plan auto` / `--cluster` run with.
set -euo pipefail
: "${PIPETRAIN:?}" "${SRC:?}" "${MPIEXEC:?}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/lib/expect.sh"
check() { check_failure "$1" one "${@:2}" || true; }
h100="$SRC/inputs/clusters/dgx-h100.toml"

# GPT-3 175B on 128 DGX H100 nodes: a ranking (tp 8, pp 8 or 16: the text; the JSON has the
# whole search), a runnable line, valid JSON for every layout.
out=$("$PIPETRAIN" plan "$SRC/inputs/gpt3-175b.toml" --cluster "$h100" --nodes 128 --tp 8 --pp 8 --pp 16 --top 3)
expect_contains "$out" "1024 devices (8 per node)" "175B header"
expect_contains "$out" "pruned for memory" "175B pruning count"
expect_contains "$out" "why: " "175B reason"
expect_contains "$out" "run it: mpirun -n 1024 pipetrain train" "175B command"
"$PIPETRAIN" plan "$SRC/inputs/gpt3-175b.toml" --cluster "$h100" --nodes 128 --top 4 --json >"$tmp/p.json"
python3 - "$tmp/p.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["devices"] == 1024 and len(j["layouts"]) == 4, j
steps = [l["step_s"] for l in j["layouts"]]
assert steps == sorted(steps) or max(steps) - min(steps) < 1e-3 * min(steps), steps
for l in j["layouts"]:
    assert l["dp"] * l["pp"] * l["tp"] == 1024, l
    assert l["dp"] * l["microbatches"] * l["microbatch_size"] == 1536, l
    assert l["memory_bytes"] <= j["usable_memory_bytes"], l
    assert sum(l["blocks_per_stage"]) == 96, l
    b = l["breakdown_s"]
    assert abs(sum(b.values()) - l["step_s"]) < 1e-9 * l["step_s"], l
    assert "parallel.dp=%d" % l["dp"] in l["overrides"], l
PY
# Restrictions: Megatron's own layout for it.
out=$("$PIPETRAIN" plan "$SRC/inputs/gpt3-175b.toml" --cluster "$SRC/inputs/clusters/dgx-a100.toml" --nodes 128 \
  --tp 8 --pp 16 --schedule interleaved-1f1b --recompute full --top 1)
expect_contains "$out" "dp 8 x pp 16 x tp 8, interleaved-1f1b" "restricted layout"

# Errors: one line each, naming the file and the key / what would fit.
sed '/^latency_us = 6/d' "$h100" >"$tmp/no_latency.toml"
check missing_key "$tmp/no_latency.toml" "inter_node.latency_us" -- \
  "$PIPETRAIN" plan "$SRC/inputs/gpt2-124m.toml" --cluster "$tmp/no_latency.toml"
sed 's/^memory_gib = 80/memory_gb = 80/' "$h100" >"$tmp/typo.toml"
check typo_key "$tmp/typo.toml" "device.memory_gib" -- "$PIPETRAIN" plan "$SRC/inputs/gpt2-124m.toml" --cluster "$tmp/typo.toml"
check no_fit "no layout of" "fits in" "the smallest needs" "GiB (dp" -- \
  "$PIPETRAIN" plan "$SRC/inputs/gpt3-175b.toml" --cluster "$h100" --nodes 1
check no_grid "no dp x pp x tp grid of 24 devices" "global batch (7)" -- \
  "$PIPETRAIN" plan "$SRC/inputs/gpt2-124m.toml" --cluster "$h100" --nodes 3 --global-batch 7 --set model.n_layer=2
check no_cluster "--cluster" -- "$PIPETRAIN" plan "$SRC/inputs/gpt2-124m.toml"
check calibrate_no_output "-o CLUSTER.toml" -- "$PIPETRAIN" plan "$SRC/inputs/austen-char.toml" --calibrate

# Calibrate 2 ranks on a small model, plan with the file, and run what it picks.
head -c 200000 "$SRC/inputs/austen.txt" >"$tmp/a.txt"
"$PIPETRAIN" data text "$tmp/a.txt" -o "$tmp/a.h5" >/dev/null
small=(--set "data.train=$tmp/a.h5" --set model.d_model=64 --set model.n_layer=2 --set train.seq_len=32
  --set train.global_batch=8 --set train.microbatches=4 --set train.steps=3 --set checkpoint.every=0
  --set log.progress=false)
"$MPIEXEC" -np 2 "$PIPETRAIN" plan "$SRC/inputs/austen-char.toml" "${small[@]}" --calibrate -o "$tmp/node.toml" \
  >"$tmp/cal.out"
expect_contains "$(cat "$tmp/cal.out")" "wrote $tmp/node.toml" "calibrate output"
[[ ! -e "$tmp/node.toml.tmp" ]] || die "calibrate left its temporary file"
grep -q '^devices_per_node = 2' "$tmp/node.toml" || die "calibrate: not 2 devices per node: $(cat "$tmp/node.toml")"
grep -q '^\[measured.fp32\]' "$tmp/node.toml" || die "calibrate: no measured rates"
out=$("$PIPETRAIN" plan "$SRC/inputs/austen-char.toml" "${small[@]}" --cluster "$tmp/node.toml" --top 2)
expect_contains "$out" "2 devices (2 per node)" "plan on the calibrated node"
out=$("$MPIEXEC" -np 2 "$PIPETRAIN" train "$SRC/inputs/austen-char.toml" "${small[@]}" --plan auto \
  --cluster "$tmp/node.toml" --metrics "$tmp/m.jsonl")
expect_contains "$out" "plan auto (best of" "train --plan auto header"
expect_contains "$out" "step time: measured median" "train --plan auto summary"
grep -q '"predicted_step_time_s"' "$tmp/m.jsonl" || die "metrics rows lack predicted_step_time_s"
# --cluster alone: the configured layout, with its prediction
out=$("$MPIEXEC" -np 2 "$PIPETRAIN" train "$SRC/inputs/austen-char.toml" "${small[@]}" --set parallel.pp=2 \
  --cluster "$tmp/node.toml")
expect_contains "$out" "plan: dp 1 x pp 2 x tp 1, 1f1b" "train --cluster header"
check bad_plan "--plan" -- "$PIPETRAIN" train "$SRC/inputs/austen-char.toml" "${small[@]}" --plan best
[[ $failures -eq 0 ]] || exit 1
echo "plan_cmd: ok"
