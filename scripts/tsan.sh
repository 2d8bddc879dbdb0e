#!/usr/bin/env bash
# ThreadSanitizer over the communicator and its progress thread, which calls MPI while the
# owner computes (tests/mpi/test_comm.cpp on 2 ranks; clang-14, build-tsan/, the few
# sources they use: target pipetrain_comm_tests). Any data race fails the run.
# Installs missing packages like test.sh. Arguments go to the test program
# (default: every CommFixture test).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

ensure_packages clang-14 libclang-rt-14-dev
mpi_env
dir=build-tsan
mkdir -p "$dir"
log "configuring $dir (clang-14, ThreadSanitizer)"
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
  -DCMAKE_CXX_FLAGS="-O1 -fsanitize=thread -fno-omit-frame-pointer" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" \
  -DPIPETRAIN_ENABLE_CUDA=OFF -DPIPETRAIN_BUILD_TESTS=ON -DPIPETRAIN_BUILD_BENCH=OFF >"$dir/configure.log" 2>&1 \
  || { cat "$dir/configure.log"; exit 1; }
sanitized_build "$dir" pipetrain_comm_tests
# halt_on_error: the first race ends the rank (and mpiexec the job) with the report.
# setarch -R: clang 14's TSan cannot map its shadow under the wide address-space
# randomisation of newer kernels ("unexpected memory mapping").
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/tests/mpi/tsan.supp"
run=()
if command -v setarch >/dev/null; then run=(setarch "$(uname -m)" -R); fi
log "running the communicator tests on 2 ranks under ThreadSanitizer"
args=("$@")
if [ ${#args[@]} -eq 0 ]; then args=(--gtest_filter='CommFixture.*'); fi
timeout 600 "${run[@]}" mpiexec -n 2 -x TSAN_OPTIONS "$dir/bin/pipetrain_comm_tests" "${args[@]}"
log "no data race"
