#!/usr/bin/env bash
# Fresh Debian 12 machine -> a training run whose loss falls, in a few minutes:
# installs missing packages, builds Release, converts the bundled corpus to an
# HDF5 token dataset and trains the demo model.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

# shellcheck disable=SC2119  # no packages beyond the build's
ensure_packages
mpi_env
configure_and_build build -DPIPETRAIN_BUILD_TESTS=OFF -DPIPETRAIN_BUILD_BENCH=OFF

mkdir -p data
log "converting inputs/austen.txt to data/austen.h5 (byte-level tokens)"
build/bin/pipetrain data text inputs/austen.txt -o data/austen.h5

log "training the demo model (inputs/austen-char.toml) on 2 MPI ranks: a 2-stage 1F1B pipeline"
mpirun -np 2 build/bin/pipetrain train inputs/austen-char.toml --set parallel.pp=2 \
  --set log.dir=data/quickstart-run --set checkpoint.dir=data/quickstart-ckpt --set checkpoint.every=100 "$@"
log "an HTML report of the run: build/bin/pipetrain report data/quickstart-run"
log "what the model writes (pipetrain generate, from the checkpoint the 2-stage run saved, on one rank):"
build/bin/pipetrain generate data/quickstart-ckpt --prompt "It is a truth universally acknowledged" \
  --tokens 300 --temperature 0.8 --top-k 40 --seed 1
