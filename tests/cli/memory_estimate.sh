#!/usr/bin/env bash
# One memory estimate: the run header (`train`), `check` and `plan` print the same figure for
# the same layout — pp with the config's split, dp with ZeRO-1 and the shard levels, tp, cp, ep and the vocabulary
# slices — because all three assemble it in one place (plan/memory_estimate.hpp). `plan`
# prices its own balanced split, so it is compared where there is no split to choose (pp 1).
# Each figure is held to the run's measured peak too (below).
set -euo pipefail
: "${PIPETRAIN:?}" "${SRC:?}" "${MPIEXEC:?}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
head -c 100000 "$SRC/inputs/austen.txt" >"$tmp/corpus.txt"
"$PIPETRAIN" data text "$tmp/corpus.txt" -o "$tmp/corpus.h5" >/dev/null
cluster=$SRC/inputs/clusters/cpu-node.toml
# GPT-2's vocabulary on small blocks: the tables make the figure large enough (about 100 MiB)
# that a part counted by one and not the other shows in whole MiB.
base=(--set data.train="$tmp/corpus.h5" --set train.steps=1 --set model.d_model=128 --set model.vocab_size=50257
      --set train.seq_len=64 --set model.max_seq_len=64 --set train.global_batch=8 --set train.microbatches=4
      --set runtime.pack_weights=false --set log.every=1)
gpt2=("$SRC/inputs/austen-char.toml" "${base[@]}")
moe=("$SRC/inputs/moe-demo.toml" "${base[@]}" --set model.vocab_size=256)

header_mib() {  # NAME RANKS CONFIG...: the run header's figure
  local name=$1 ranks=$2
  shift 2
  timeout 300 "$MPIEXEC" -np "$ranks" "$PIPETRAIN" train "$@" --set checkpoint.dir="$tmp/$name" \
    --metrics "$tmp/$name.jsonl" </dev/null >"$tmp/$name.train" 2>&1 || { cat "$tmp/$name.train"; exit 1; }
  grep -o "memory estimate [0-9]* MiB" "$tmp/$name.train" | grep -o "[0-9]*"
}
check_mib() {  # NAME CONFIG...: check's figure for the same layout
  local name=$1
  shift
  timeout 300 "$PIPETRAIN" check "$@" >"$tmp/$name.check" 2>&1 || { cat "$tmp/$name.check"; exit 1; }
  grep -o "memory estimate [0-9]* MiB" "$tmp/$name.check" | grep -o "[0-9]*"
}
plan_mib() {  # NAME MICROBATCHES ZERO1 PLAN-OPTIONS... -- CONFIG...: plan's figure for that layout
  local name=$1 m=$2 zero1=$3
  shift 3
  local opts=()
  while [ "$1" != "--" ]; do opts+=("$1"); shift; done
  shift
  timeout 300 "$PIPETRAIN" plan "$@" --cluster "$cluster" --nodes 1 --top 1000 --json --precision fp32 \
    --recompute none "${opts[@]}" >"$tmp/$name.plan" 2>&1 || { cat "$tmp/$name.plan"; exit 1; }
  python3 - "$tmp/$name.plan" "$m" "$zero1" <<'PY'
import json, sys
plan, m, zero1 = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
default_windows = lambda o: "parallel.shard_reuse=keep" not in o and "parallel.shard_prefetch=0" not in o
picked = [l for l in plan["layouts"] if f"train.microbatches={m}" in l["overrides"]
          and f"parallel.zero1={zero1}" in l["overrides"] and "parallel.vocab_parallel=false" in l["overrides"]
          and default_windows(l["overrides"])]  # the run's: regather, prefetch 1
assert picked, f"plan ranks no layout of {m} microbatches, zero1 {zero1}"
print(round(picked[0]["memory_bytes"] / 2**20))
PY
}
# Every figure equal, and within 10% of the run's measured peak (the largest rank's pool
# high-water, packed copies and reductions' scratch): the estimate's parts are the sizes the
# run allocates, its activations the schedule's stash peaks, so 10% (the issue's bound) is
# room for the pool's rounding and what the estimate leaves out (the loss's buffers).
same() {  # WHAT RUN FIGURES...
  local what=$1 run=$2 first=$3
  shift 3
  for f in "$@"; do
    [ "$f" = "$first" ] || { echo "FAIL: $what: the estimates differ: $first MiB against $f MiB" >&2; exit 1; }
  done
  python3 - "$tmp/$run.jsonl" "$what" "$first" <<'PY'
import json, sys
peak = max(json.loads(l)["peak_mem_bytes"] for l in open(sys.argv[1])) / 2**20
what, estimate = sys.argv[2], float(sys.argv[3])
ratio = estimate / peak
print(f"{'ok' if 0.9 <= ratio <= 1.1 else 'FAIL'}: {what}: {estimate:.0f} MiB from each, measured peak {peak:.0f} MiB "
      f"(estimate / peak {ratio:.2f})")
sys.exit(0 if 0.9 <= ratio <= 1.1 else 1)
PY
}

# Each figure into a variable first: a failing command then stops the test (set -e).
split=(--set parallel.pp=2 --set "parallel.layers_per_stage=[2,2]")
h=$(header_mib pp 2 "${gpt2[@]}" "${split[@]}" --set parallel.vocab_parallel=false)
c=$(check_mib pp "${gpt2[@]}" "${split[@]}" --set parallel.vocab_parallel=false)
same "pp 2, split 2,2, whole layers" pp "$h" "$c"
vocab=("${split[@]}" --set parallel.vocab_parallel=true)
h=$(header_mib vp 2 "${gpt2[@]}" "${vocab[@]}"); c=$(check_mib vp "${gpt2[@]}" "${vocab[@]}")
same "pp 2, vocabulary slices" vp "$h" "$c"
zero=(--set parallel.dp=2 --set parallel.zero1=true)
h=$(header_mib dp 2 "${gpt2[@]}" "${zero[@]}"); c=$(check_mib dp "${gpt2[@]}" "${zero[@]}")
p=$(plan_mib dp 4 true --pp 1 --tp 1 --shard optimizer -- "${gpt2[@]}")
same "dp 2, ZeRO-1" dp "$h" "$c" "$p"
# Sharded data parallelism: a dp-th of the state, and the units the program holds whole.
for level in gradients weights; do
  shard=(--set parallel.dp=2 --set "parallel.shard=$level")
  h=$(header_mib "$level" 2 "${gpt2[@]}" "${shard[@]}"); c=$(check_mib "$level" "${gpt2[@]}" "${shard[@]}")
  p=$(plan_mib "$level" 4 true --pp 1 --tp 1 --shard "$level" -- "${gpt2[@]}")
  same "dp 2, shard $level" "$level" "$h" "$c" "$p"
done
# Hybrid: 4 replicas in groups of 2, each part twice as large, its all-reduce across the groups.
shard=(--set parallel.dp=4 --set parallel.shard=weights --set parallel.shard_group=2 --set train.microbatches=2)
h=$(header_mib hybrid 4 "${gpt2[@]}" "${shard[@]}"); c=$(check_mib hybrid "${gpt2[@]}" "${shard[@]}")
same "dp 4, shard weights, groups of 2" hybrid "$h" "$c"
# bf16 under "weights": the parts rounded too, the gathered units as bf16 and widened copies.
shard=(--set parallel.dp=2 --set parallel.shard=weights --set train.precision=bf16)
h=$(header_mib weights-bf16 2 "${gpt2[@]}" "${shard[@]}"); c=$(check_mib weights-bf16 "${gpt2[@]}" "${shard[@]}")
same "dp 2, shard weights, bf16" weights-bf16 "$h" "$c"
h=$(header_mib tp 2 "${gpt2[@]}" --set parallel.tp=2); c=$(check_mib tp "${gpt2[@]}" --set parallel.tp=2)
p=$(plan_mib tp 4 false --pp 1 --tp 2 -- "${gpt2[@]}")
same "tp 2" tp "$h" "$c" "$p"
h=$(header_mib cp 2 "${gpt2[@]}" --set parallel.cp=2); c=$(check_mib cp "${gpt2[@]}" --set parallel.cp=2)
same "cp 2" cp "$h" "$c"
experts=(--set parallel.dp=2 --set parallel.ep=2)
h=$(header_mib ep 2 "${moe[@]}" "${experts[@]}"); c=$(check_mib ep "${moe[@]}" "${experts[@]}")
p=$(plan_mib ep 4 false --pp 1 --tp 1 --ep 2 -- "${moe[@]}")
same "dp 2, ep 2" ep "$h" "$c" "$p"
# The experts under sharded weights: with ep = dp each rank holds its experts alone (in place,
# never gathered); the rest sharded over both ranks.
experts=(--set parallel.dp=2 --set parallel.ep=2 --set parallel.shard=weights)
h=$(header_mib ep-weights 2 "${moe[@]}" "${experts[@]}"); c=$(check_mib ep-weights "${moe[@]}" "${experts[@]}")
p=$(plan_mib ep-weights 4 true --pp 1 --tp 1 --ep 2 --shard weights -- "${moe[@]}")
same "dp 2, ep 2, shard weights" ep-weights "$h" "$c" "$p"
# Where the stashes dominate (bytes, 8 microbatches of 8 x 256 tokens, pp 2): what each
# microbatch keeps from F to its backward, the weight pass's gradients a ZB-H1 cell holds
# from its I to its W, and the one layer's a full backward holds at a time.
stash=("$SRC/inputs/austen-char.toml" --set data.train="$tmp/corpus.h5" --set train.steps=1 --set train.seq_len=256
       --set model.max_seq_len=256 --set train.global_batch=64 --set train.microbatches=8 --set parallel.pp=2
       --set runtime.pack_weights=false --set log.every=1)
for run in "1f1b none 1" "1f1b selective 1" "zb-h1 none 1" "zb-h1 selective 1" "interleaved-1f1b selective 2"; do
  read -r sched mode v <<<"$run"
  layout=("${stash[@]}" --set "schedule.name=$sched" --set "train.recompute=$mode" --set "parallel.virtual_stages=$v")
  h=$(header_mib "stash-$sched-$mode" 2 "${layout[@]}"); c=$(check_mib "stash-$sched-$mode" "${layout[@]}")
  same "pp 2, $sched, recompute $mode: stashes" "stash-$sched-$mode" "$h" "$c"
done
