#!/usr/bin/env bash
# Benchmark: `pipetrain plan --calibrate` then `pipetrain train --plan auto` on 2 ranks,
# GPT-2 124M at 8 sequences of 256 tokens a step: the measured median step against the
# step the plan predicted for the layout it picked (the calibration prices the products on
# the paths the run will take, packed and plain, and the plan applies the run's packing
# rule to each layout).
#
#   bash bench/bench_plan_auto.sh [BUILD_DIR (build)] [STEPS (5)]
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
sets=(--set "data.train=$work/austen.h5" --set train.seq_len=256 --set train.global_batch=8 --set train.microbatches=2
  --set "train.steps=$steps" --set checkpoint.every=0 --set "checkpoint.dir=$work/ck" --set log.progress=false)
lscpu | grep -E "^Model name|^Flags" | sed 's/^Flags:.*\(avx512f\).*/AVX-512: yes/; s/^Flags:.*/AVX-512: no/'
echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset)}"
$mpiexec -n 2 --bind-to core "$pt" plan "$cfg" "${sets[@]}" --calibrate -o "$work/cluster.toml"
"$pt" plan "$cfg" "${sets[@]}" --cluster "$work/cluster.toml" --precision fp32 --top 3 | head -8
$mpiexec -n 2 --bind-to core "$pt" train "$cfg" "${sets[@]}" --set train.precision=fp32 --plan auto \
  --cluster "$work/cluster.toml" | grep -E "^  backend|dense products|^  grid|^step time"
