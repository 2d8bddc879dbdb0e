#!/usr/bin/env bash
# Reference runs for a change that must leave behaviour unchanged: a set of short
# trainings over the grids, schedules, model families and precisions, each printed as one
# line "name  losses-hash  checkpoint-hash". Run it before and after the change on the same
# machine and build type, and compare: a refactoring keeps every line, bit for bit.
#
#   scripts/reference-runs.sh BUILD_DIR OUT_DIR > before.txt
#   (change, rebuild)
#   scripts/reference-runs.sh BUILD_DIR OUT_DIR > after.txt && diff before.txt after.txt
#
# The losses hash is over every step's loss and gradient norm as the metrics file writes
# them (17 significant digits); the checkpoint hash over every dataset's values in hex
# floats (h5dump -m %a), the metadata attributes left out (a refactoring may add one).
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 BUILD_DIR OUT_DIR" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
out=$2
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$build/bin/pipetrain
command -v h5dump >/dev/null || { echo "error: h5dump (Debian's hdf5-tools) is needed" >&2; exit 1; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
data=$out/austen.h5
[ -f "$data" ] || "$bin" data text "$root/inputs/austen.txt" -o "$data" >/dev/null

# The small models every run starts from: 4 blocks of d_model 64, 3 steps of 8 sequences
# of 64 bytes in 4 microbatches, a checkpoint at the last step.
common=(--set train.steps=3 --set train.global_batch=8 --set train.microbatches=4 --set train.seq_len=64
  --set train.warmup_steps=1 --set model.n_layer=4 --set model.d_model=64 --set model.max_seq_len=64
  --set checkpoint.every=3 --set log.every=1 --set "data.train=$data")
gpt2=("$root/inputs/pipeline-4rank.toml" --set parallel.pp=1 --set parallel.virtual_stages=1 --set schedule.name=1f1b)
llama=("$root/inputs/llama-demo.toml" --set model.ffn_hidden=176)
moe=("$root/inputs/moe-demo.toml" --set model.expert_ffn_hidden=64 --set model.ffn_hidden=176)

launch() {  # RANKS: the MPI launcher for that many ranks (oversubscribed on a small machine)
  if [ "$1" -eq 1 ]; then return; fi
  local mpi=(mpiexec -n "$1" --oversubscribe)
  [ "$(id -u)" -ne 0 ] || mpi+=(--allow-run-as-root)
  printf '%s\n' "${mpi[@]}"
}

run() {  # NAME RANKS CONFIG-ARGS...: train, then print the line
  local name=$1 ranks=$2
  shift 2
  local dir=$out/$name
  rm -rf "$dir"
  mkdir -p "$dir"
  local -a mpi
  mapfile -t mpi < <(launch "$ranks")
  if ! "${mpi[@]}" "$bin" train "$@" "${common[@]}" --set "checkpoint.dir=$dir/ckpt" --set "log.dir=$dir/log" \
    </dev/null >"$dir/train.log" 2>&1; then
    echo "error: $name failed; its output: $dir/train.log" >&2
    exit 1
  fi
  local losses ckpt
  losses=$(grep -o '"grad_norm":[^,]*\|"loss":[^,]*' "$dir/log/metrics.jsonl" | sha256sum | cut -c1-16)
  ckpt=$(h5dump -A 0 -m %a "$dir/ckpt/step_00000003.h5" | tail -n +2 | sha256sum | cut -c1-16)
  printf '%-22s %s %s\n' "$name" "$losses" "$ckpt"
}

run gpt2-1rank 1 "${gpt2[@]}"
run gpt2-pp2-1f1b 2 "${gpt2[@]}" --set parallel.pp=2
run gpt2-pp2-zbh1 2 "${gpt2[@]}" --set parallel.pp=2 --set schedule.name=zb-h1
run gpt2-pp2-interleaved 2 "${gpt2[@]}" --set parallel.pp=2 --set parallel.virtual_stages=2 \
  --set schedule.name=interleaved-1f1b
run gpt2-pp2-dualpipev 2 "${gpt2[@]}" --set parallel.pp=2 --set parallel.virtual_stages=2 \
  --set schedule.name=dualpipev
run gpt2-tp2-sp 2 "${gpt2[@]}" --set parallel.tp=2
run gpt2-dp2-zero1 2 "${gpt2[@]}" --set parallel.dp=2 --set parallel.zero1=true
run gpt2-cp2 2 "${gpt2[@]}" --set parallel.cp=2
run gpt2-pp2-vocab 2 "${gpt2[@]}" --set parallel.pp=2 --set parallel.vocab_parallel=true
run gpt2-pp2-bf16 2 "${gpt2[@]}" --set parallel.pp=2 --set train.precision=bf16
run gpt2-dp2-pp2 4 "${gpt2[@]}" --set parallel.dp=2 --set parallel.pp=2
run llama-1rank 1 "${llama[@]}"
run llama-pp2-tp2 4 "${llama[@]}" --set parallel.pp=2 --set parallel.tp=2
run llama-cp2-tp2-zbh1 4 "${llama[@]}" --set parallel.cp=2 --set parallel.tp=2 --set schedule.name=zb-h1
run moe-1rank 1 "${moe[@]}"
run moe-dp2-ep2 2 "${moe[@]}" --set parallel.dp=2 --set parallel.ep=2
run moe-dp2-ep2-pp2-dualpipev 4 "${moe[@]}" --set parallel.dp=2 --set parallel.ep=2 --set parallel.pp=2 \
  --set parallel.virtual_stages=2 --set schedule.name=dualpipev
run moe-tp2-bf16 2 "${moe[@]}" --set parallel.tp=2 --set train.precision=bf16
