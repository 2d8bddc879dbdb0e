#!/usr/bin/env bash
# CLI test: `pipetrain train` with a bad config must fail fast (non-zero exit, no hang)
# and print exactly one error line on stderr that names the file and the key.
# Env: PIPETRAIN (the built executable), SRC (source dir; unused here).
set -euo pipefail
: "${PIPETRAIN:?set PIPETRAIN to the pipetrain executable}"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

# expect_error NAME NEEDLE... -- ARGS...: runs `pipetrain train ARGS...` and checks that it
# exits non-zero within 60 s with one non-empty stderr line containing every NEEDLE.
expect_error() {
  local name=$1
  shift
  local needles=()
  while [[ $1 != -- ]]; do
    needles+=("$1")
    shift
  done
  shift
  local rc=0
  timeout 60 "$PIPETRAIN" train "$@" </dev/null >"$tmp/$name.out" 2>"$tmp/$name.err" || rc=$?
  local problem=""
  if [[ $rc -eq 0 ]]; then
    problem="exited 0"
  elif [[ $rc -eq 124 || $rc -eq 137 ]]; then
    problem="hung (killed after 60 s)"
  else
    local lines
    lines=$(grep -c . "$tmp/$name.err" || true)
    if [[ $lines -ne 1 ]]; then
      problem="expected exactly 1 line on stderr, got $lines"
    else
      local needle
      for needle in "${needles[@]}"; do
        grep -qF -- "$needle" "$tmp/$name.err" || problem+="stderr lacks '$needle'; "
      done
    fi
  fi
  if [[ -n $problem ]]; then
    echo "FAIL $name (exit $rc): $problem"
    echo "--- stderr:"
    cat "$tmp/$name.err"
    echo "--- stdout:"
    cat "$tmp/$name.out"
    failures=$((failures + 1))
  else
    echo "ok   $name: $(cat "$tmp/$name.err")"
  fi
}

# A config that would be valid (data is not opened before the config is checked).
write_config() {
  printf '[data]\ntrain = "%s/none.h5"\n%s' "$tmp" "$2" >"$tmp/$1"
}

expect_error missing_file "$tmp/nope.toml" "cannot open file" -- "$tmp/nope.toml"

write_config syntax.toml $'[train]\nsteps = = 3\n'
expect_error syntax_error "$tmp/syntax.toml:4:" -- "$tmp/syntax.toml"

write_config unknown_key.toml $'[model]\nn_layr = 2\n'
expect_error unknown_key "$tmp/unknown_key.toml" "model.n_layr" "model.n_layer" -- "$tmp/unknown_key.toml"

write_config wrong_type.toml $'[train]\nlr = "abc"\n'
expect_error wrong_type "$tmp/wrong_type.toml" "train.lr" -- "$tmp/wrong_type.toml"

write_config good.toml ""
expect_error override_type "$tmp/good.toml" "train.steps" -- "$tmp/good.toml" --set train.steps=2.5
expect_error override_unknown "model.n_layr" -- "$tmp/good.toml" --set model.n_layr=2

if [[ $failures -ne 0 ]]; then
  echo "$failures case(s) failed"
  exit 1
fi
echo "all config error cases passed"
