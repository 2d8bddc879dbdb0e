#!/usr/bin/env bash
# CLI test: `pipetrain train` with a bad config must fail fast (non-zero exit, no hang)
# and print exactly one error line on stderr that names the file and the key.
# Env: PIPETRAIN (the built executable), SRC (source dir; unused here).
set -euo pipefail
: "${PIPETRAIN:?set PIPETRAIN to the pipetrain executable}"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/lib/expect.sh"
# train_fails NAME NEEDLE... -- ARGS...: `pipetrain train ARGS...` fails within 60 s with
# one stderr line holding every NEEDLE.
train_fails() {
  local head=()
  while [[ $1 != -- ]]; do head+=("$1"); shift; done
  shift
  EXPECT_TIMEOUT=60 check_failure "${head[0]}" one "${head[@]:1}" -- "$PIPETRAIN" train "$@" || true
}

# A config that would be valid (data is not opened before the config is checked).
write_config() {
  printf '[data]\ntrain = "%s/none.h5"\n%s' "$tmp" "$2" >"$tmp/$1"
}

train_fails missing_file "$tmp/nope.toml" "cannot open file" -- "$tmp/nope.toml"

write_config syntax.toml $'[train]\nsteps = = 3\n'
train_fails syntax_error "$tmp/syntax.toml:4:" -- "$tmp/syntax.toml"

write_config unknown_key.toml $'[model]\nn_layr = 2\n'
train_fails unknown_key "$tmp/unknown_key.toml" "model.n_layr" "model.n_layer" -- "$tmp/unknown_key.toml"

write_config wrong_type.toml $'[train]\nlr = "abc"\n'
train_fails wrong_type "$tmp/wrong_type.toml" "train.lr" -- "$tmp/wrong_type.toml"

write_config good.toml ""
train_fails override_type "$tmp/good.toml" "train.steps" -- "$tmp/good.toml" --set train.steps=2.5
train_fails override_unknown "model.n_layr" -- "$tmp/good.toml" --set model.n_layr=2

# Sharded data parallelism: a level the grid cannot take, a group that does not divide dp.
train_fails shard_one_replica "$tmp/good.toml" "parallel.shard" "more than one replica" -- "$tmp/good.toml" \
  --set parallel.shard=weights
train_fails shard_unknown "$tmp/good.toml" "parallel.shard" "unknown level" -- "$tmp/good.toml" \
  --set parallel.shard=everything
train_fails shard_group "$tmp/good.toml" "parallel.shard_group (3) must divide" -- "$tmp/good.toml" \
  --set parallel.dp=4 --set parallel.shard=weights --set parallel.shard_group=3
train_fails shard_group_ep "$tmp/good.toml" "parallel.shard_group (1) must be a multiple of parallel.ep (2)" -- \
  "$tmp/good.toml" --set model.arch=llama --set model.n_experts=4 --set parallel.dp=4 --set parallel.ep=2 \
  --set parallel.shard=weights --set parallel.shard_group=1
train_fails shard_packed "$tmp/good.toml" 'parallel.shard = "weights"' "no whole weights to pack" -- "$tmp/good.toml" \
  --set parallel.dp=2 --set parallel.shard=weights --set runtime.pack_weights=true

exit_with_failures
