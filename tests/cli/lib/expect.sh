# shellcheck shell=bash disable=SC2154  # `tmp` is the sourcing script's
# Shared by the command-line tests (source it after setting `tmp`): failure reporting
# and the checks that a command fails with an error line naming something.
die() { echo "FAIL: $*" >&2; exit 1; }
failures=0

expect_contains() {  # TEXT NEEDLE WHAT
  [[ "$1" == *"$2"* ]] || die "$3: expected '$2' in: $1"
}

# check_failure NAME LINES NEEDLE... -- CMD...: CMD (stdin closed; unless it is a shell
# function, killed after ${EXPECT_TIMEOUT:-120} s) must exit non-zero, not by the timeout, with every NEEDLE on
# stderr. LINES = one: exactly one stderr line (one process); ranks: at least one
# "pipetrain: error" line (mpiexec adds lines of its own). A failed check is printed
# and counted in $failures; the script goes on (end it with `exit_with_failures`).
check_failure() {
  local name=$1 lines=$2
  shift 2
  local needles=()
  while [[ $1 != -- ]]; do
    needles+=("$1")
    shift
  done
  shift
  local rc=0 problem="" n needle
  local run=(timeout "${EXPECT_TIMEOUT:-120}")
  if [[ $(type -t "$1") == function ]]; then run=(); fi  # a script's own wrapper (it sets its timeout)
  "${run[@]}" "$@" </dev/null >"$tmp/$name.out" 2>"$tmp/$name.err" || rc=$?
  if [[ $rc -eq 0 ]]; then
    problem="exited 0"
  elif [[ $rc -eq 124 || $rc -eq 137 ]]; then
    problem="hung (killed after ${EXPECT_TIMEOUT:-120} s)"
  else
    if [[ $lines == one ]]; then
      n=$(grep -c . "$tmp/$name.err" || true)
      [[ $n -eq 1 ]] || problem="expected exactly 1 line on stderr, got $n; "
    else
      n=$(grep -c "pipetrain: error" "$tmp/$name.err" || true)
      [[ $n -ge 1 ]] || problem="no 'pipetrain: error' line on stderr; "
    fi
    for needle in "${needles[@]}"; do
      grep -qF -- "$needle" "$tmp/$name.err" || problem+="stderr lacks '$needle'; "
    done
  fi
  if [[ -n $problem ]]; then
    echo "FAIL $name (exit $rc): $problem"
    echo "--- stderr:"
    cat "$tmp/$name.err"
    echo "--- stdout:"
    tail -20 "$tmp/$name.out"
    failures=$((failures + 1))
    return 1
  fi
  echo "ok   $name: $(grep -m1 . "$tmp/$name.err")"
}

exit_with_failures() {
  if [[ $failures -ne 0 ]]; then
    echo "$failures case(s) failed"
    exit 1
  fi
}

# expect_failure NEEDLE CMD...: check_failure with one stderr line; stops the script at
# the first failure. The command's output stays in $tmp/out.txt and $tmp/err.txt.
expect_failure() {
  check_failure expect one "$1" -- "${@:2}" || die "'${*:2}' did not fail as expected"
  cp "$tmp/expect.out" "$tmp/out.txt"
  cp "$tmp/expect.err" "$tmp/err.txt"
}
