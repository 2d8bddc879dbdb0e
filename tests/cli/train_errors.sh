#!/usr/bin/env bash
# `pipetrain train` refuses bad datasets and grids with one error line naming the
# file or key, a non-zero exit on every rank, and no hang.
set -euo pipefail
: "${PIPETRAIN:?}" "${SRC:?}" "${MPIEXEC:?}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cfg="$SRC/inputs/austen-char.toml"
source "$(dirname "$0")/lib/expect.sh"
# check NAME NEEDLE CMD...: CMD exits non-zero with a "pipetrain: error" line and NEEDLE.
check() { check_failure "$1" ranks "$2" -- "${@:3}" || true; }

printf 'not an hdf5 file\n' >"$tmp/junk.h5"
head -c 100 "$SRC/inputs/austen.txt" >"$tmp/tiny.txt"
"$PIPETRAIN" data text "$tmp/tiny.txt" -o "$tmp/tiny.h5" >/dev/null
head -c 5000 "$SRC/inputs/austen.txt" >"$tmp/small.txt"
"$PIPETRAIN" data text "$tmp/small.txt" -o "$tmp/small.h5" >/dev/null

check missing_data "$tmp/nope.h5" "$PIPETRAIN" train "$cfg" --set data.train="$tmp/nope.h5"
check not_hdf5 "$tmp/junk.h5" "$PIPETRAIN" train "$cfg" --set data.train="$tmp/junk.h5"
check too_few_tokens "$tmp/tiny.h5" "$PIPETRAIN" train "$cfg" --set data.train="$tmp/tiny.h5"
check vocab_too_big "$tmp/small.h5" "$PIPETRAIN" train "$cfg" --set data.train="$tmp/small.h5" \
  --set model.vocab_size=100
check bad_seq_len "train.seq_len" "$PIPETRAIN" train "$cfg" --set train.seq_len=4096
check bad_batch "train.global_batch" "$PIPETRAIN" train "$cfg" --set train.global_batch=15

# Two ranks for a one-rank grid: every rank says so and the job exits non-zero.
check world_mismatch "does not match the 2 MPI ranks" \
  "$MPIEXEC" -np 2 "$PIPETRAIN" train "$cfg" --set data.train="$tmp/small.h5"
n=$(grep -c "does not match" "$tmp/world_mismatch.err" || true)
if [[ $n -lt 1 ]]; then echo "FAIL world_mismatch: no rank reported the mismatch"; failures=$((failures + 1)); fi

# Pipeline errors: refused before any compute, every rank exits, nothing hangs.
check bad_schedule "schedule.name" \
  "$MPIEXEC" -np 2 "$PIPETRAIN" train "$cfg" --set data.train="$tmp/small.h5" --set parallel.pp=2 \
  --set schedule.name=no-such
check bad_microbatches "schedule.name" \
  "$MPIEXEC" -np 2 "$PIPETRAIN" train "$cfg" --set data.train="$tmp/small.h5" --set parallel.pp=2 \
  --set parallel.virtual_stages=2 --set schedule.name=interleaved-1f1b --set train.microbatches=3 \
  --set train.global_batch=3
check too_many_stages "more than the model.n_layer" \
  "$MPIEXEC" -np 2 "$PIPETRAIN" train "$cfg" --set data.train="$tmp/small.h5" --set parallel.pp=2 \
  --set parallel.virtual_stages=4
check tp_heads "must divide model.n_head" \
  "$MPIEXEC" -np 2 "$PIPETRAIN" train "$cfg" --set data.train="$tmp/small.h5" --set parallel.tp=2 \
  --set model.n_head=1
check dp_batch "train.global_batch" \
  "$MPIEXEC" -np 2 "$PIPETRAIN" train "$cfg" --set data.train="$tmp/small.h5" --set parallel.dp=2 \
  --set train.global_batch=6

# No GPU here (or a CPU-only build): runtime.device = "cuda" is refused with the reason.
check no_gpu "runtime.device" "$PIPETRAIN" train "$cfg" --set data.train="$tmp/small.h5" --set runtime.device=cuda

exit_with_failures
