#!/usr/bin/env bash
# The planner against published large-model runs: Megatron-LM's weak-scaling table
# (Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
# Megatron-LM", SC'21, Table 1: GPT models, seq 2048, vocab 51200, DGX A100 80 GB nodes,
# interleaved 1F1B, full activation recomputation, mixed precision).
#
#   bash bench/bench_plan_published.sh [BUILD_DIR (build)]
#
# The rows: bench/published/megatron-sc21-table1.tsv (tests/cli/plan_published.sh holds the
# prediction for Megatron's layout within 20% on the rows marked held).
# For each row: the planner's free choice on inputs/clusters/dgx-a100.toml, and its
# prediction for Megatron's own layout (its tp and pp, interleaved-1f1b, full
# recomputation, no ZeRO). TFLOP/s are counted as the paper counts them:
# 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) per step (recomputation and full attention counted).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$src/build}
pt="$build/bin/pipetrain"
cluster="$src/inputs/clusters/dgx-a100.toml"
echo "| model | GPUs | published: tp, pp → TFLOP/s/GPU | planner, Megatron's layout → TFLOP/s/GPU (ratio) | planner's choice → TFLOP/s/GPU | planning time |"
echo "|---|---|---|---|---|---|"
while read -r p heads h layers tp pp gpus batch published _; do
  sets=(--set model.n_head="$heads" --set model.d_model="$h" --set model.n_layer="$layers" --set model.vocab_size=51200
    --set model.max_seq_len=2048 --set train.seq_len=2048 --set train.global_batch="$batch" --set train.precision=bf16)
  nodes=$((gpus / 8))
  theirs=$("$pt" plan "$src/inputs/gpt3-175b.toml" "${sets[@]}" --cluster "$cluster" --nodes "$nodes" --precision bf16 \
    --tp "$tp" --pp "$pp" --recompute full --zero1 off --schedule "$([ "$pp" -gt 1 ] && echo interleaved-1f1b || echo 1f1b)" \
    --top 1 --json)
  t0=$(date +%s.%N)
  ours=$("$pt" plan "$src/inputs/gpt3-175b.toml" "${sets[@]}" --cluster "$cluster" --nodes "$nodes" --precision bf16 \
    --top 1 --json)
  t1=$(date +%s.%N)
  PYTHONPATH=$src/bench/published python3 - "$p" "$h" "$layers" "$batch" "$gpus" "$tp" "$pp" "$published" \
    "$(echo "$t1 - $t0" | bc)" <<PY
import json, sys
from megatron_flops import step_flops
p, h, l, B, gpus, tp, pp, pub, secs = sys.argv[1:]
gpus, pub = int(gpus), float(pub)
flops = step_flops(h, l, B)
theirs = json.loads('''$theirs''')["layouts"][0]
ours = json.loads('''$ours''')["layouts"][0]
def tf(x): return flops / x["step_s"] / gpus / 1e12
def lay(x):
    v = " v%d" % x["virtual_stages"] if x["pp"] > 1 and x["virtual_stages"] > 1 else ""
    sched = x["schedule"] + v if x["pp"] > 1 else "no pipeline"
    return "dp %d × pp %d × tp %d, %s, %d × %d, recompute %s%s" % (x["dp"], x["pp"], x["tp"], sched,
        x["microbatches"], x["microbatch_size"], x["recompute"], ", ZeRO-1" if x["zero1"] else "")
print("| %sB | %d | tp %s, pp %s → %.0f | %s → %.0f (%.2f) | %s → %.0f | %.1f s |" % (p, gpus, tp, pp, pub,
      lay(theirs), tf(theirs), tf(theirs) / pub, lay(ours), tf(ours), float(secs)))
PY
done < <(grep -v '^#' "$src/bench/published/megatron-sc21-table1.tsv")
