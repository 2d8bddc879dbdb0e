#!/usr/bin/env bash
# Benchmark: the planner's predicted step against the measured one, for every 2-rank
# layout of GPT-2 small shapes (pp = 2 with each schedule, tp = 2, dp = 2), after
# calibrating this machine on the same 2 ranks; and whether the plan's first choice is
# the measured fastest (or within 5% of it).
#
#   bash bench/bench_plan.sh [BUILD_DIR (build)] [STEPS (5)]
#
# Each layout trains STEPS steps (the first is a warm-up); the measured figure is the
# median of the rest, as `pipetrain train --cluster` prints it.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$src/build}
steps=${2:-5}
pt="$build/bin/pipetrain"
mpiexec=${MPIEXEC:-mpiexec}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$pt" data text "$src/inputs/austen.txt" --tokenizer gpt2 -o "$work/austen.h5" >/dev/null
cfg="$src/inputs/gpt2-124m.toml"
sets=(--set "data.train=$work/austen.h5" --set train.seq_len=128 --set train.global_batch=8 --set train.microbatches=8
  --set "train.steps=$steps" --set checkpoint.every=0 --set log.progress=false)
$mpiexec -n 2 --bind-to core "$pt" plan "$cfg" "${sets[@]}" --calibrate -o "$work/cluster.toml"
"$pt" plan "$cfg" "${sets[@]}" --cluster "$work/cluster.toml" --precision fp32 --top 3 | head -6
first=$("$pt" plan "$cfg" "${sets[@]}" --cluster "$work/cluster.toml" --precision fp32 --top 1 --json |
  python3 -c 'import json,sys; l=json.load(sys.stdin)["layouts"][0]; print(" ".join("--set "+o for o in l["overrides"]))')
layouts=(
  "pp=2 gpipe|--set parallel.pp=2 --set schedule.name=gpipe"
  "pp=2 1f1b|--set parallel.pp=2 --set schedule.name=1f1b"
  "pp=2 interleaved-1f1b v2|--set parallel.pp=2 --set parallel.virtual_stages=2 --set schedule.name=interleaved-1f1b"
  "pp=2 looped-bfs v2|--set parallel.pp=2 --set parallel.virtual_stages=2 --set schedule.name=looped-bfs"
  "pp=2 zb-h1|--set parallel.pp=2 --set schedule.name=zb-h1"
  "pp=2 zbv|--set parallel.pp=2 --set parallel.virtual_stages=2 --set schedule.name=zbv"
  "pp=2 dualpipev|--set parallel.pp=2 --set parallel.virtual_stages=2 --set schedule.name=dualpipev"
  "tp=2|--set parallel.tp=2"
  "dp=2 (m=4)|--set parallel.dp=2 --set train.microbatches=4"
  "plan's first choice|$first"
)
echo
echo "| layout (m = 8 microbatches of 1 x 128 unless said) | predicted (ms) | measured (ms) | measured / predicted |"
echo "|---|---|---|---|"
for entry in "${layouts[@]}"; do
  name=${entry%%|*}
  # shellcheck disable=SC2086
  line=$($mpiexec -n 2 --bind-to core "$pt" train "$cfg" "${sets[@]}" ${entry#*|} --cluster "$work/cluster.toml" |
    grep '^step time: measured median')
  read -r measured predicted ratio < <(sed -E 's/.*median ([0-9.]+) ms.*predicted ([0-9.]+) ms.*predicted ([0-9.]+)\)/\1 \2 \3/' <<<"$line")
  echo "| $name | $predicted | $measured | $ratio |"
done
