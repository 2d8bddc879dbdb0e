#!/usr/bin/env bash
# The unit suite under AddressSanitizer + UndefinedBehaviorSanitizer (the `debug`
# preset's flags, in build-debug/): any memory error or undefined behaviour fails the
# run. Installs missing packages like test.sh. Leak detection is off: Open MPI unloads
# its plugins (dlclose) with allocations still held, which LeakSanitizer reports from
# "<unknown module>" frames that no suppression can name.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

# shellcheck disable=SC2119  # no packages beyond the build's
ensure_packages
mpi_env
dir=build-debug
# Also for the test discovery that runs the test binary at build time.
# Allocation failures return null (the tests check our out-of-memory errors).
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:strict_string_checks=1:allocator_may_return_null=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# GCC 12's -Wmaybe-uninitialized misfires inside libstdc++'s <regex> and <functional>
# once ASan instruments them (false positives in system headers, not our code).
nowarn="-Wno-maybe-uninitialized"
log "configuring $dir (Debug, -fsanitize=address,undefined)"
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS="-O1 -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer $nowarn" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DPIPETRAIN_ENABLE_CUDA=OFF -DPIPETRAIN_BUILD_TESTS=ON -DPIPETRAIN_BUILD_BENCH=OFF >"$dir.configure.log" 2>&1 \
  || { cat "$dir.configure.log"; exit 1; }
log "building the unit tests with $(nproc) jobs"
cmake --build "$dir" -j "$(nproc)" --target pipetrain_tests >"$dir.build.log" 2>&1 || { tail -n 60 "$dir.build.log"; exit 1; }
log "running the unit suite under the sanitizers"
ctest --test-dir "$dir" --output-on-failure -j "$(nproc)" -E '^(cli|mpi)\.' "$@"
