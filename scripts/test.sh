#!/usr/bin/env bash
# Installs missing packages, builds Release with tests, and runs the whole CTest suite;
# then, in one clang tree (build-sanitize/), the unit suite and mpi.np2 under
# AddressSanitizer + UBSan (scripts/sanitize.sh) and every fuzz target over its committed
# corpus plus a short run (scripts/fuzz.sh, PIPETRAIN_FUZZ_SECONDS, default here 5); and
# the communicator's progress thread under ThreadSanitizer (scripts/tsan.sh). Each part
# prints its time. Arguments go to ctest and skip the sanitizer and fuzz passes
# (e.g. ./scripts/test.sh -R unit.test_config).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

timed() {  # NAME CMD...: runs CMD, then prints how long it took
  local name=$1 start=$SECONDS
  shift
  "$@"
  log "$name took $((SECONDS - start)) s"
}
timed "installing packages" ensure_packages "${PIPETRAIN_TEST_PACKAGES[@]}"
install_tiktoken build/oracle/tiktoken
mpi_env
# The command layer and the tests at -O1: a quarter less compile time, the kernels at -O3.
timed "the Release build" configure_and_build build -DPIPETRAIN_BUILD_TESTS=ON -DPIPETRAIN_BUILD_BENCH=ON \
  -DPIPETRAIN_WARNINGS_AS_ERRORS=ON -DPIPETRAIN_COLD_CODE_OPTIMIZATION=-O1
log "running the test suite"
timed "the test suite" ctest --test-dir build --output-on-failure -j "$(nproc)" "$@"
[ $# -eq 0 ] || exit 0
timed "the sanitized suites" bash scripts/sanitize.sh
timed "ThreadSanitizer" bash scripts/tsan.sh
if [ "${PIPETRAIN_SKIP_FUZZ:-0}" != 1 ]; then
  timed "fuzzing" env PIPETRAIN_FUZZ_SECONDS="${PIPETRAIN_FUZZ_SECONDS:-5}" bash scripts/fuzz.sh
fi
