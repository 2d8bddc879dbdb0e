#!/usr/bin/env bash
# Installs missing packages, builds Release with tests, and runs the whole CTest suite;
# then the unit suite under AddressSanitizer + UBSan (scripts/sanitize.sh) and each fuzz
# target for a bounded time (scripts/fuzz.sh). Arguments go to ctest and skip the
# sanitizer and fuzz passes (e.g. ./scripts/test.sh -R Kernel).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

ensure_packages "${PIPETRAIN_TEST_PACKAGES[@]}"
mpi_env
configure_and_build build -DPIPETRAIN_BUILD_TESTS=ON -DPIPETRAIN_BUILD_BENCH=ON -DPIPETRAIN_WARNINGS_AS_ERRORS=ON
install_tiktoken build/oracle/tiktoken
log "running the test suite"
ctest --test-dir build --output-on-failure -j "$(nproc)" "$@"
[ $# -eq 0 ] || exit 0
bash scripts/sanitize.sh
[ "${PIPETRAIN_SKIP_FUZZ:-0}" = 1 ] || bash scripts/fuzz.sh
