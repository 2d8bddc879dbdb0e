#!/usr/bin/env bash
# Train on a workstation (or inside an interactive allocation) with plain mpirun.
#
#   jobscripts/workstation.sh CONFIG [NRANKS] [pipetrain train options...]
#   jobscripts/workstation.sh inputs/austen-char.toml 2 --set parallel.pp=2
#   RESUME=auto jobscripts/workstation.sh inputs/pipeline-4rank.toml     # continue a run
#
# Variables (arguments win over the environment):
#   CONFIG       TOML config (first argument)
#   NRANKS       MPI ranks (second argument when it is a number; default: parallel.dp * pp *
#                cp * tp of the config after the --set options)
#   PIPETRAIN    pipetrain executable (default: `pipetrain` on PATH, else this
#                checkout's build/bin/pipetrain)
#   MPIEXEC      launcher (default mpirun)
#   MPIEXEC_ARGS more launcher options, split on spaces (e.g. "--bind-to core")
#   OVERSUBSCRIBE  1 (default) lets Open MPI start more ranks than cores; 0 = off
#   THREADS      BLAS/OpenMP threads per rank (default: pipetrain shares the node's
#                CPUs among the ranks on it; set it to pin a count)
#   CKPT_DIR     checkpoint directory (adds --set checkpoint.dir=CKPT_DIR)
#   RESUME       value of --resume: auto (newest checkpoint in checkpoint.dir that
#                verifies, or step 0) or a checkpoint file; default: none (a new run)
#   TRAIN_ARGS   more `pipetrain train` options, split on spaces
#   PIPETRAIN_DRY_RUN=1  print the command instead of running it
#
# Stop with a checkpoint: kill -USR1 <pid of this script> (it becomes mpirun, which
# forwards SIGUSR1 to the ranks); pipetrain finishes the step, checkpoints, exits 0.
# Ctrl-C (SIGINT) stops at once without a checkpoint.
set -euo pipefail

# shellcheck source=jobscripts/lib/pipetrain_job.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/pipetrain_job.sh"

if [ $# -ge 1 ] && [[ $1 != -* ]]; then
  CONFIG=$1
  shift
fi
[ -n "${CONFIG:-}" ] || pt_die "usage: $0 CONFIG [NRANKS] [pipetrain train options...]"
if [ $# -ge 1 ] && [[ $1 =~ ^[0-9]+$ ]]; then
  NRANKS=$1
  shift
fi
[ -f "$CONFIG" ] || pt_die "config $CONFIG not found"
PIPETRAIN=$(pt_find_pipetrain)
MPIEXEC=${MPIEXEC:-mpirun}

train_args=()
if [ -n "${RESUME:-}" ]; then
  train_args+=(--resume "$RESUME")
fi
if [ -n "${CKPT_DIR:-}" ]; then
  train_args+=(--set "checkpoint.dir=$CKPT_DIR")
fi
read -r -a extra_train <<<"${TRAIN_ARGS:-}"
train_args+=("${extra_train[@]}" "$@")
NRANKS=${NRANKS:-$(pt_grid_ranks "$CONFIG" "${train_args[@]}")}

read -r -a launcher <<<"${MPIEXEC_ARGS:-}"
if "$MPIEXEC" --version 2>&1 | grep -q -e "Open MPI" -e "OpenRTE"; then
  if [ "${OVERSUBSCRIBE:-1}" = 1 ]; then
    launcher+=(--oversubscribe)
  fi
  if [ "$(id -u)" -eq 0 ]; then
    launcher+=(--allow-run-as-root)
  fi
fi
[ "${PIPETRAIN_DRY_RUN:-0}" = 1 ] || [ -x "$PIPETRAIN" ] || pt_die "pipetrain executable $PIPETRAIN not found (set PIPETRAIN)"

if [ -n "${THREADS:-}" ]; then
  export OPENBLAS_NUM_THREADS=$THREADS OMP_NUM_THREADS=$THREADS
fi
if [ "${PIPETRAIN_DRY_RUN:-0}" = 1 ]; then
  pt_run "$MPIEXEC" "${launcher[@]}" -np "$NRANKS" "$PIPETRAIN" train "$CONFIG" "${train_args[@]}"
  exit 0
fi
exec "$MPIEXEC" "${launcher[@]}" -np "$NRANKS" "$PIPETRAIN" train "$CONFIG" "${train_args[@]}"
