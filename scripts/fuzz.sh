#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang (AddressSanitizer + UBSan) in
# build-sanitize/ (the tree scripts/sanitize.sh shares) and runs each one on a scratch copy
# of its committed corpus: every input of the corpus is replayed, then it fuzzes for a
# bounded time.
# Exits non-zero if any target crashes, hangs, runs out of memory or trips a sanitizer,
# naming the target and the reproducer in build-fuzz/artifacts/.
#
#   scripts/fuzz.sh                      # every target, 30 s each
#   scripts/fuzz.sh fuzz_token_file      # only the named targets
#
# Environment:
#   PIPETRAIN_FUZZ_SECONDS  seconds per target (default 30)
#   ASAN_OPTIONS, UBSAN_OPTIONS  passed through (default: quarantine_size_mb=64, stack traces)
#
# Reproduce a finding: build-sanitize/bin/<target> build-sanitize/artifacts/<target>/crash-...
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

ensure_packages clang-14 libclang-rt-14-dev
mpi_env

DIR=build-sanitize
SECONDS_EACH=${PIPETRAIN_FUZZ_SECONDS:-30}
ALL_TARGETS=(fuzz_schedule_csv fuzz_config_toml fuzz_token_file fuzz_checkpoint_meta fuzz_text_formats)
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then TARGETS=("${ALL_TARGETS[@]}"); fi
for t in "${TARGETS[@]}"; do
  [[ " ${ALL_TARGETS[*]} " == *" $t "* ]] || { echo "error: unknown fuzz target $t (known: ${ALL_TARGETS[*]})" >&2; exit 2; }
done

configure_sanitized "$DIR"
sanitized_build "$DIR" "${TARGETS[@]}"

# A hang is a failure (-timeout), so is a run-away allocation (-rss_limit_mb, and
# -malloc_limit_mb follows it). New corpus entries go to a scratch copy, never into git.
# A smaller ASan quarantine keeps the HDF5 targets well below the RSS limit.
export ASAN_OPTIONS=${ASAN_OPTIONS:-quarantine_size_mb=64}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
BIN=$PWD/$DIR/bin
ARTIFACTS=$PWD/$DIR/artifacts
# The fuzzers grow a copy of the seeds; the repository's corpus stays as it is.
CORPUS_COPY=$(mktemp -d "${TMPDIR:-/tmp}/pipetrain-fuzz.XXXXXX")
trap 'rm -rf "$CORPUS_COPY"' EXIT
failed=()
run_start=$(date +%s)
for t in "${TARGETS[@]}"; do
  mkdir -p "$ARTIFACTS/$t" "$CORPUS_COPY/$t"
  cp -R tests/fuzz/corpus/"$t"/. "$CORPUS_COPY/$t/"
  log "fuzzing $t for $SECONDS_EACH s"
  rc=0
  (cd "$CORPUS_COPY" && TMPDIR="$CORPUS_COPY" "$BIN/$t" \
      -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 \
      -artifact_prefix="$ARTIFACTS/$t/" -print_final_stats=1 \
      "$CORPUS_COPY/$t") >"$DIR/$t.log" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    repro=$(grep -a -o "Test unit written to .*" "$DIR/$t.log" | tail -n 1 | sed 's/Test unit written to //')
    grep -a -v "^INFO: \|^#[0-9]" "$DIR/$t.log" | tail -n 60
    echo "FAIL: $t (exit $rc); reproducer: ${repro:-none written, see $DIR/$t.log}"
    echo "      rerun: $BIN/$t ${repro:-}"
    failed+=("$t")
  else
    echo "    $(grep -a -E "^stat::(number_of_executed_units|new_units_added|peak_rss_mb)" "$DIR/$t.log" \
      | sed 's/^stat:://; s/: */ /' | tr '\n' ' ')"
  fi
done
log "fuzzing took $(( $(date +%s) - run_start )) s"

if [ ${#failed[@]} -ne 0 ]; then
  echo "fuzzing failed: ${failed[*]} (logs: $DIR/<target>.log, reproducers: $ARTIFACTS/)" >&2
  exit 1
fi
log "all fuzz targets ran $SECONDS_EACH s without a finding"
