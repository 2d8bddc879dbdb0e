#!/usr/bin/env bash
# Installs missing packages, builds Release with tests, and runs the whole CTest suite.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

ensure_packages "${PIPETRAIN_TEST_PACKAGES[@]}"
mpi_env
configure_and_build build -DPIPETRAIN_BUILD_TESTS=ON -DPIPETRAIN_BUILD_BENCH=ON
log "running the test suite"
ctest --test-dir build --output-on-failure -j "$(nproc)" "$@"
