#!/usr/bin/env bash
# The unit suite and the 2-rank MPI suite under AddressSanitizer + UndefinedBehaviorSanitizer
# (clang-14, in build-sanitize/, the tree scripts/fuzz.sh shares): any memory error or
# undefined behaviour fails the run. Installs missing packages like test.sh. Arguments go
# to ctest (e.g. -R unit.test_config).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

ensure_packages clang-14 libclang-rt-14-dev
mpi_env
dir=build-sanitize
# Also for the test discovery that runs the test binary at build time.
# Allocation failures return null (the tests check our out-of-memory errors).
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:strict_string_checks=1:allocator_may_return_null=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
configure_sanitized "$dir"
sanitized_build "$dir" pipetrain_tests pipetrain_mpi_tests
log "running the unit suite, mpi.np2 and mpi.np2.packed_weights under the sanitizers"
ctest --test-dir "$dir" --output-on-failure -j "$(nproc)" -R '^(unit\.|mpi\.np2(\.packed_weights)?$)' "$@"
