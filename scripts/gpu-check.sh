#!/usr/bin/env bash
# The one command a GPU machine runs: builds with CUDA and NCCL (or uses a prebuilt tree,
# PIPETRAIN_GPU_BUILD=DIR), then runs the checks in order of how much each decides, every
# one under its own time limit and all of them inside PIPETRAIN_GPU_CHECK_BUDGET seconds
# (default 540: 9 minutes, the build included). One summary line per check:
#   gpu-check: NAME: PASS|FAIL|SKIP — detail
# Checks: kernels (every CUDA kernel test against the CPU backend, the mixture-of-experts
# router (its choices, rows and counts exactly), row kernels and grouped products and context parallelism's ring-attention block kernels
# among them; PASS only when CUDA cases ran, never when all skipped), cudnn-attention (bf16
# attention forward and backward on cuDNN's graphs against the flash kernels and the CPU,
# within the derived bf16 bound, and the calls it is not asked for on the flash kernels; PASS
# only when its cases ran: no GPU or no cuDNN is a FAIL),
# demo-fp32 (20 GPU steps against the CPU, 1e-4 relative; the mixture-of-experts demo's
# 10, 1e-3), demo-bf16 (within the derived
# bound), two-ranks-one-gpu (pp = 2, cp = 2 and the mixture-of-experts demo's ep = 2 under
# 1f1b and dualpipev over host-staged MPI), nccl-one-gpu (a one-rank NCCL group: all-reduce, a
# send to and a receive from itself, an all-to-all), nccl-two-gpus (tp = 2, pp = 2 and ep = 2
# under 1f1b and dualpipev over NCCL, with 4 GPUs dp 4 x ep 2; 2 GPUs or more), sanitizers (compute-sanitizer memcheck on 3 steps and on the
# mixture-of-experts kernel tests, racecheck on those and the attention tests, the ring's block
# kernels included), gpt2-124m-bf16 (tokens/s and
# MFU against the 50% target: it informs, it does not fail the check).
# Logs: every step's under the folder given as the argument (or $OUT, or ./gpu-check-logs),
# with summary.txt; the first failure's log is printed at the end. A step that hangs is
# killed at its limit and the later steps still run. Without a GPU every check says
# "no GPU: skipped" and the script exits 0 (CI runs it so it cannot rot).
# Rehearsal on a CPU machine: PIPETRAIN_GPU_CHECK_STANDINS=FILE is sourced after the steps
# are defined, so it can replace any of them (tests/cli/gpu_check.sh). Exit status 1 if any
# check failed.
# The steps are called by name (step, run_limited): shellcheck cannot see it.
# shellcheck disable=SC2317
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
source scripts/common.sh

logs=${1:-${OUT:-gpu-check-logs}}
budget=${PIPETRAIN_GPU_CHECK_BUDGET:-540}
checks=(kernels cudnn-attention demo-fp32 demo-bf16 two-ranks-one-gpu nccl-one-gpu nccl-two-gpus sanitizers
        gpt2-124m-bf16)
declare -A limit=([build]=270 [kernels]=60 [cudnn-attention]=90 [demo-fp32]=90 [demo-bf16]=60
                  [two-ranks-one-gpu]=120 [nccl-one-gpu]=30 [nccl-two-gpus]=120 [sanitizers]=150 [gpt2-124m-bf16]=90)
build=${PIPETRAIN_GPU_BUILD:-build-gpu}
PT=$build/bin/pipetrain

# ---- the steps: each writes its log to stdout; `detail: ...` lines become the summary;
# exit 0 passes, 77 skips, anything else fails ----
have_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

build_gpu() {
  if [ -x "$PT" ] && [ -x "$build/bin/pipetrain_tests" ] && [ -n "${PIPETRAIN_GPU_BUILD:-}" ]; then
    echo "detail: prebuilt $build"
    return 0
  fi
  mpi_env
  configure_and_build "$build" -DPIPETRAIN_ENABLE_CUDA=ON -DPIPETRAIN_BUILD_TESTS=ON -DPIPETRAIN_BUILD_BENCH=ON
  "$PT" --version | sed -n '3p;5p'
}

# PASS only when the CUDA cases ran: on a GPU machine a case skipped for want of a GPU
# ("no GPU: ...") means the tests could not use it.
check_kernels() {
  "$build/bin/pipetrain_tests" --gtest_filter='*cuda*:*Cuda*:*Nccl*'
  local rc=$? ran skipped no_gpu
  ran=$(grep -c '^\[       OK \]' "$logs/kernels.log")
  skipped=$(grep -c '^\[  SKIPPED \]' "$logs/kernels.log")
  no_gpu=$(grep -c '^no GPU: ' "$logs/kernels.log")
  echo "detail: $ran cases passed, $skipped skipped"
  if [ "$no_gpu" -gt 0 ]; then
    echo "detail: $no_gpu CUDA cases found no GPU ($(grep -m1 '^no GPU: ' "$logs/kernels.log"))"
    return 1
  fi
  if [ "$rc" -eq 77 ]; then return 1; fi  # every case skipped
  return "$rc"
}

# tests/test_cuda_cudnn_attention.cpp (its limit allows for cuDNN compiling each plan and the
# double-precision bounds at T = 1024). PASS only when its cases ran: a case skipped for want of
# a GPU ("no GPU: ...") or of cuDNN ("no cuDNN: ...") is a FAIL on a GPU machine.
check_cudnn_attention() {
  local tests=$build/bin/pipetrain_tests log=$logs/cudnn-attention.log rc ran skipped missing
  [ -x "$tests" ] || { echo "detail: no $tests"; return 1; }
  "$tests" --gtest_filter='CudnnAttention*'
  rc=$?
  ran=$(grep -c '^\[       OK \]' "$log")
  skipped=$(grep -c '^\[  SKIPPED \]' "$log")
  missing=$(grep -cE '^no (GPU|cuDNN): ' "$log")
  echo "detail: $ran cases passed, $skipped skipped"
  if [ "$missing" -gt 0 ]; then
    echo "detail: $missing cases found no GPU or no cuDNN ($(grep -m1 -E '^no (GPU|cuDNN): ' "$log"))"
    return 1
  fi
  if [ "$rc" -eq 77 ]; then return 1; fi  # every case skipped
  return "$rc"
}

corpus() {  # the demo's data, a few MB of text, once
  if [ -s "$logs/corpus.h5" ]; then return 0; fi
  head -c 2000000 inputs/austen.txt >"$logs/corpus.txt"
  "$PT" data text "$logs/corpus.txt" -o "$logs/corpus.h5" >/dev/null
}
demo() {  # [-n RANKS] ARGS...: the demo's training, on one rank or RANKS under mpiexec
  local launch=()
  if [ "${1:-}" = -n ]; then
    launch=(mpiexec -n "$2")
    shift 2
  fi
  corpus && "${launch[@]}" "$PT" train "${demo_config:-inputs/austen-char.toml}" --set data.train="$logs/corpus.h5" \
    --set log.every=100 \
    --set train.lr_schedule=constant --set train.warmup_steps=0 "$@"
}

compare() {  # A.jsonl B.jsonl TOL -> prints the worst relative difference; fails above TOL
  python3 - "$@" <<'PY'
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
tol = float(sys.argv[3])
worst = max(abs(x - y) / abs(y) for x, y in zip(a, b)) if a and len(a) == len(b) else float("inf")
print(f"detail: worst relative loss difference {worst:.2e} over {len(a)} steps (tolerance {tol:g})")
sys.exit(0 if worst <= tol else 1)
PY
}

# 20 demo steps on the GPU against the CPU. The bf16 tolerance is the training bound of
# tests/test_mixed_precision.cpp: 2 (9 n_layer + 4) 2^-8 = 0.31 for the demo's 4 layers
# (both runs round at the same points; only f32 orders differ).
demo_vs_cpu() {  # PRECISION TOLERANCE [NAME STEPS]
  local dev name=${3:-$1} steps=${4:-20}
  for dev in cpu cuda; do
    demo --set train.steps="$steps" --set train.precision="$1" --set runtime.device="$dev" \
      --metrics "$logs/$name-$dev.jsonl" || return 1
  done
  compare "$logs/$name-cuda.jsonl" "$logs/$name-cpu.jsonl" "$2"
}
# Then the mixture-of-experts demo, 10 steps: its router, permutations and grouped products
# on the device. Rounding in the router's f32 logits may flip a near-tied choice; one token
# of a step's 2048 routed elsewhere in one layer moves the mean loss by about 1e-4 of it,
# so 1e-3 allows a few such flips and still fails a wrong kernel (a wrong route or product
# moves every token's loss).
check_demo_fp32() {
  demo_vs_cpu fp32 1e-4 || return 1
  demo_config=inputs/moe-demo.toml demo_vs_cpu fp32 1e-3 moe-fp32 10
}
check_demo_bf16() { demo_vs_cpu bf16 0.31; }

# Two ranks sharing the GPU against one rank: pp = 2 with the pipeline's transfers over MPI
# (NCCL needs one GPU per rank), then cp = 2 (the ring over host-staged MPI, its block
# kernels on the GPU), then the mixture-of-experts demo on dp = 2 with ep = 2 (the expert
# exchanges over host-staged MPI), under 1f1b and under dualpipev (its F&B pairs overlapped
# as on CPUs).
check_two_ranks_one_gpu() {
  local grid
  mpi_env
  demo --set train.steps=10 --set runtime.device=cuda --metrics "$logs/pp1.jsonl" || return 1
  for grid in parallel.pp=2 parallel.cp=2; do
    demo -n 2 --set train.steps=10 --set "$grid" --set runtime.device=cuda --set comm.p2p=mpi \
      --metrics "$logs/two.jsonl" || return 1
    echo "detail: $grid" && compare "$logs/two.jsonl" "$logs/pp1.jsonl" 1e-4 || return 1
  done
  rm -f "$logs"/moe1-m*.jsonl  # this build's one-GPU runs, made afresh
  moe_ep2 2 2 --set comm.p2p=mpi || return 1
  moe_ep2 2 4 --set comm.p2p=mpi "${dualpipev[@]}"
}

# dualpipev on one pipeline rank: both V stages there, so its F&B pairs run from the start.
dualpipev=(--set schedule.name=dualpipev --set parallel.virtual_stages=2)

# The mixture-of-experts demo, 10 steps, on DP ranks with ep = 2 and M microbatches each
# (launched over MPI, configured by the rest), against one GPU: fp32, 1e-4 relative per step
# as for dp. The load-balancing losses are a microbatch's, so the one GPU runs DP x M
# microbatches, each the same sequences as a dp rank's.
moe_ep2() {  # DP M ARGS...
  local demo_config=inputs/moe-demo.toml dp=$1 m=$2 one
  shift 2
  one="$logs/moe1-m$((dp * m)).jsonl"
  if [ "$(wc -l <"$one" 2>/dev/null)" != 10 ]; then
    demo --set train.steps=10 --set train.microbatches=$((dp * m)) --set runtime.device=cuda --metrics "$one" ||
      return 1
  fi
  demo -n "$dp" --set train.steps=10 --set parallel.dp="$dp" --set parallel.ep=2 --set train.microbatches="$m" \
    --set runtime.device=cuda "$@" --metrics "$logs/moe-ep.jsonl" || return 1
  echo "detail: moe-demo dp $dp, ep 2, $m microbatches $*"
  compare "$logs/moe-ep.jsonl" "$one" 1e-4
}

# One rank's NCCL group through the real communicator, events and error polling.
check_nccl_one_gpu() {
  "$build/bin/pipetrain_tests" --gtest_filter='OneRankNccl.*'
  local rc=$?
  if [ "$rc" -eq 0 ]; then echo "detail: a one-rank all-reduce and a send to itself in a group"; fi
  if [ "$rc" -eq 77 ]; then echo "detail: skipped on a GPU machine: $(grep -m1 -B1 'SKIPPED' "$logs/nccl-one-gpu.log" | sed -n 1p)"; fi
  if [ "$rc" -eq 77 ]; then return 1; fi
  return "$rc"
}

# With two GPUs or more: tp = 2, then pp = 2 over NCCL (one rank per GPU) against one GPU
# (fp32; tensor parallelism reorders sums: 1e-4 relative per step).
check_nccl_two_gpus() {
  local ngpu grid
  ngpu=$(nvidia-smi -L | wc -l)
  [ "$ngpu" -ge 2 ] || { echo "detail: needs 2 GPUs (NCCL runs one rank per GPU); this machine has $ngpu"; return 77; }
  mpi_env
  [ -s "$logs/pp1.jsonl" ] || demo --set train.steps=10 --set runtime.device=cuda --metrics "$logs/pp1.jsonl" || return 1
  for grid in parallel.tp=2 parallel.pp=2; do
    demo -n 2 --set train.steps=10 --set "$grid" --set runtime.device=cuda --set comm.p2p=nccl \
      --metrics "$logs/nccl.jsonl" || return 1
    echo "detail: $grid" && compare "$logs/nccl.jsonl" "$logs/pp1.jsonl" 1e-4 || return 1
  done
  # The expert exchanges over NCCL, then under dualpipev (pp = 1 keeps its pairs: their
  # halves take fixed turns), then with 4 GPUs the expert-dp sums over NCCL too (dp 4, ep 2).
  moe_ep2 2 2 --set comm.p2p=nccl && moe_ep2 2 4 --set comm.p2p=nccl "${dualpipev[@]}" || return 1
  if [ "$ngpu" -ge 4 ]; then moe_ep2 4 2 --set comm.p2p=nccl; fi
}

check_sanitizers() {
  local cs=compute-sanitizer
  command -v "$cs" >/dev/null || cs=/usr/local/cuda/bin/compute-sanitizer
  [ -x "$(command -v "$cs")" ] || { echo "detail: compute-sanitizer not found"; return 77; }
  corpus || return 1
  "$cs" --tool memcheck --error-exitcode 3 "$PT" train inputs/austen-char.toml --set data.train="$logs/corpus.h5" \
    --set train.steps=3 --set runtime.device=cuda --set log.every=100 || { echo "detail: memcheck failed"; return 1; }
  "$cs" --tool memcheck --error-exitcode 3 "$build/bin/pipetrain_tests" --gtest_filter='CudaVsCpu.MixtureOfExperts*' ||
    { echo "detail: memcheck of the mixture-of-experts kernels failed"; return 1; }
  "$cs" --tool racecheck --error-exitcode 3 "$build/bin/pipetrain_tests" \
    --gtest_filter='CudaVsCpu.Attention*:CudaVsCpu.Decode*:*KernelAttentionBlockTest*/cuda:CudaVsCpu.MixtureOfExperts*' ||
    { echo "detail: racecheck failed"; return 1; }
  echo "detail: memcheck on 3 steps and the mixture-of-experts kernels, racecheck on those and the attention tests" \
    "(the ring's block kernels too) clean"
}

# GPT-2 124M, T = 1024, bf16: tokens/s and MFU against the best cuBLASLt bf16 product rate
# measured in this run (bench_gemm_rate). The MFU line informs; only a failed run fails.
check_gpt2_124m_bf16() {
  local rate
  rate=$("$build/bin/bench_gemm_rate" cuda 8192 10 | awk '/^best/ {print $2}')
  [ -n "$rate" ] || { echo "detail: bench_gemm_rate gave no rate"; return 1; }
  corpus && "$PT" train inputs/gpt2-124m.toml --set data.train="$logs/corpus.h5" --set train.steps=6 \
    --set train.precision=bf16 --set runtime.device=cuda --set log.every=1 \
    --set log.peak_flops="$(python3 -c "print(float('$rate') * 1e12)")" --metrics "$logs/124m.jsonl" || return 1
  python3 - "$logs/124m.jsonl" "$rate" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][1:]  # step 0 includes start-up
tps = sum(r["tokens_per_s"] for r in rows) / len(rows)
mfu = sum(r["mfu"] for r in rows) / len(rows)
print(f"detail: {tps:.0f} tokens/s, MFU {100 * mfu:.1f}% of the {float(sys.argv[2]):.0f} TFLOP/s bf16 gemm rate "
      "(target 50%: informs, does not fail)")
PY
}

# shellcheck source=/dev/null
if [ -n "${PIPETRAIN_GPU_CHECK_STANDINS:-}" ]; then source "$PIPETRAIN_GPU_CHECK_STANDINS"; fi

# ---- running them ----
failures=0 first_failure=""
line() {  # NAME STATUS DETAIL
  printf 'gpu-check: %s: %s — %s\n' "$1" "$2" "$3" | tee -a "$logs/summary.txt"
  if [ "$2" = FAIL ]; then
    failures=$((failures + 1))
    [ -n "$first_failure" ] || first_failure=$1
  fi
}

# Runs FN with its output in LOG, in its own process group, killed (children included)
# after LIMIT seconds; returns FN's status, or 124 when it was killed.
run_limited() {  # LIMIT FN LOG
  set -m
  ( "$2" ) >"$3" 2>&1 &
  local pid=$! deadline=$((SECONDS + $1))
  set +m
  while kill -0 "$pid" 2>/dev/null; do
    if [ $SECONDS -ge $deadline ]; then
      kill -TERM -- "-$pid" 2>/dev/null
      for _ in 1 2 3 4 5 6 7 8 9 10; do
        if kill -0 "$pid" 2>/dev/null; then sleep 0.2; fi
      done
      kill -KILL -- "-$pid" 2>/dev/null
      wait "$pid" 2>/dev/null
      return 124
    fi
    sleep 0.2
  done
  wait "$pid"
}

step() {  # NAME: runs check_NAME (or build_gpu) within its limit and what is left of the budget
  local name=$1 fn=check_${1//-/_} left rc detail
  if [ "$name" = build ]; then fn=build_gpu; fi
  left=$((budget - SECONDS))
  if [ $left -lt 5 ]; then
    line "$name" SKIP "the time budget (${budget} s) is spent"
    return 1
  fi
  local t=${limit[$name]}
  [ "$t" -le "$left" ] || t=$left
  run_limited "$t" "$fn" "$logs/$name.log"
  rc=$?
  detail=$(grep '^detail: ' "$logs/$name.log" | sed 's/^detail: //' | awk 'NR > 1 { printf "; " } { printf "%s", $0 }')
  if [ $rc -eq 124 ]; then
    line "$name" FAIL "killed after ${t} s${detail:+ ($detail)}; log $logs/$name.log"
  elif [ $rc -eq 77 ]; then
    line "$name" SKIP "${detail:-skipped}"
  elif [ $rc -ne 0 ]; then
    [ -n "$detail" ] || detail=$(grep -m1 -iE 'error|fail' "$logs/$name.log" || tail -1 "$logs/$name.log")
    line "$name" FAIL "$detail; log $logs/$name.log"
  else
    line "$name" PASS "${detail:-ok}"
  fi
  return $rc
}

SECONDS=0
if ! have_gpu; then
  for c in "${checks[@]}"; do printf 'gpu-check: %s: SKIP — no GPU: skipped\n' "$c"; done
  exit 0
fi
mkdir -p "$logs" && logs=$(cd "$logs" && pwd) || exit 1
: >"$logs/summary.txt"
if step build; then
  for c in "${checks[@]}"; do step "$c"; done
else
  for c in "${checks[@]}"; do line "$c" SKIP "the build failed"; done
fi
echo "gpu-check: $failures failed, ${SECONDS} s of the ${budget} s budget; logs in $logs"
if [ -n "$first_failure" ]; then
  echo "gpu-check: the first failure, $first_failure (the end of $logs/$first_failure.log):"
  tail -n 40 "$logs/$first_failure.log"
fi
exit $((failures > 0))
