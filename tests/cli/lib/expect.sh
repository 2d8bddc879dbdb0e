# Shared by the command-line tests (source it after setting `tmp`): failure reporting
# and the check that a command fails with exactly one error line naming something.
die() { echo "FAIL: $*" >&2; exit 1; }

expect_contains() {  # TEXT NEEDLE WHAT
  [[ "$1" == *"$2"* ]] || die "$3: expected '$2' in: $1"
}

# Runs a command expected to fail; checks exit status (not a timeout), exactly one
# stderr line, and NEEDLE in it.
expect_failure() {  # NEEDLE CMD...
  local name=$1
  shift
  local rc=0
  "$@" > "$tmp/out.txt" 2> "$tmp/err.txt" || rc=$?
  [[ $rc -ne 0 ]] || die "'$*' succeeded"
  [[ $rc -ne 124 ]] || die "'$*' timed out"
  local lines
  lines=$(grep -c . "$tmp/err.txt" || true)
  [[ $lines -eq 1 ]] || die "'$*': expected one error line, got $lines: $(cat "$tmp/err.txt")"
  expect_contains "$(cat "$tmp/err.txt")" "$name" "error of '$*'"
  echo "ok (failed as expected): $(cat "$tmp/err.txt")"
}
