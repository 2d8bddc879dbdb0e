#!/usr/bin/env bash
# End-to-end test of `pipetrain data`: converts a text file, a synthetic llm.c shard and
# a raw uint16 array; checks `pipetrain data info`, h5ls and h5dump views of /tokens;
# checks that bad input (missing file, bad magic, truncated shard, non-HDF5 file) exits
# non-zero with one error line naming the file and leaves no output behind.
# Env: PIPETRAIN = the executable; MPIEXEC (optional) = mpiexec for the 2-rank check.
set -euo pipefail
: "${PIPETRAIN:?set PIPETRAIN to the pipetrain executable}"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=tests/cli/lib/expect.sh
source "$(dirname "$0")/lib/expect.sh"
pt() { timeout 120 "$PIPETRAIN" "$@"; }

# Little-endian binary writers (no python needed).
# shellcheck disable=SC2059  # the format is the bytes' escapes, built on purpose
le32() {
  local v=$(( $1 & 0xffffffff ))
  printf "$(printf '\\x%02x\\x%02x\\x%02x\\x%02x' $((v & 255)) $(((v >> 8) & 255)) \
    $(((v >> 16) & 255)) $(((v >> 24) & 255)))"
}
# shellcheck disable=SC2059
le16() { printf "$(printf '\\x%02x\\x%02x' $(($1 & 255)) $((($1 >> 8) & 255)))"; }
# write_shard FILE MAGIC VERSION TOKEN...  (llm.c: 256 int32 header, then uint16 tokens)
write_shard() {
  local file=$1 magic=$2 version=$3
  shift 3
  {
    le32 "$magic"; le32 "$version"; le32 $#
    head -c $((253 * 4)) /dev/zero
    for t in "$@"; do le16 "$t"; done
  } > "$file"
}


# --- text -> byte tokens --------------------------------------------------------------
printf 'hello, pipetrain\n' > "$tmp/a.txt"  # 17 bytes
printf 'second file' > "$tmp/b.txt"        # 11 bytes
out=$(pt data text "$tmp/a.txt" "$tmp/b.txt" -o "$tmp/text.h5")
echo "$out"
[[ "$(head -1 <<<"$out")" == "wrote $tmp/text.h5: 28 tokens, vocab 256 (byte), uint16" ]] || die "text summary: $out"
[[ "$(tail -1 <<<"$out")" == "28 tokens in "*" tokens/s (byte tokenizer, one core)" ]] || die "text rate: $out"
[[ ! -e "$tmp/text.h5.tmp" ]] || die "temporary file left behind"

info=$(pt data info "$tmp/text.h5")
echo "$info"
expect_contains "$info" "tokens 28" "data info"
expect_contains "$info" "vocab_size 256" "data info"
expect_contains "$info" "tokenizer byte" "data info"
expect_contains "$info" "dtype uint16" "data info"

listing=$(h5ls "$tmp/text.h5")
[[ "$listing" =~ tokens\ +Dataset\ \{28\} ]] || die "h5ls: $listing"
header=$(h5dump -H "$tmp/text.h5")
expect_contains "$header" 'DATASET "tokens"' "h5dump -H"
expect_contains "$header" "H5T_STD_U16LE" "h5dump -H"
expect_contains "$header" "SIMPLE { ( 28 ) / ( 28 ) }" "h5dump -H"
expect_contains "$header" 'ATTRIBUTE "vocab_size"' "h5dump -H"
expect_contains "$header" 'ATTRIBUTE "tokenizer"' "h5dump -H"
values=$(h5dump -d /tokens -s 0 -c 3 "$tmp/text.h5")
expect_contains "$values" "104, 101, 108" "first tokens are the bytes of 'hel'"

# --- llm.c shards -> GPT-2 tokens -----------------------------------------------------
write_shard "$tmp/s0.bin" 20240520 1 50256 15496 11 995 0
write_shard "$tmp/s1.bin" 20240520 1 1 2 50255
out=$(pt data llmc "$tmp/s0.bin" "$tmp/s1.bin" -o "$tmp/gpt2.h5")
echo "$out"
[[ "$out" == "wrote $tmp/gpt2.h5: 8 tokens, vocab 50257 (gpt2), uint16" ]] || die "llmc summary: $out"
info=$(pt data info "$tmp/gpt2.h5")
expect_contains "$info" "tokens 8, vocab_size 50257, tokenizer gpt2, dtype uint16" "data info"
[[ "$(h5ls "$tmp/gpt2.h5")" =~ tokens\ +Dataset\ \{8\} ]] || die "h5ls gpt2.h5"
values=$(h5dump -d /tokens "$tmp/gpt2.h5")
expect_contains "$values" "50256, 15496, 11, 995, 0, 1, 2, 50255" "llmc tokens"

# --- raw uint16 array -----------------------------------------------------------------
{ le16 7; le16 300; le16 999; } > "$tmp/raw.bin"
out=$(pt data raw "$tmp/raw.bin" --dtype u16 --vocab 1000 -o "$tmp/raw.h5")
[[ "$out" == "wrote $tmp/raw.h5: 3 tokens, vocab 1000 (unknown), uint16" ]] || die "raw summary: $out"

# --- errors: one line naming the file, non-zero exit, nothing written -----------------
expect_failure "$tmp/missing.txt" pt data text "$tmp/missing.txt" -o "$tmp/x.h5"
write_shard "$tmp/bad.bin" 12345 1 1 2 3
expect_failure "$tmp/bad.bin" pt data llmc "$tmp/s0.bin" "$tmp/bad.bin" -o "$tmp/x.h5"
expect_contains "$(cat "$tmp/err.txt")" "bad magic" "bad-magic error"
write_shard "$tmp/short.bin" 20240520 1 1 2 3
truncate -s -1 "$tmp/short.bin"
expect_failure "$tmp/short.bin" pt data llmc "$tmp/short.bin" -o "$tmp/x.h5"
expect_contains "$(cat "$tmp/err.txt")" "truncated" "truncated-shard error"
expect_failure "$tmp/a.txt" pt data info "$tmp/a.txt"
expect_contains "$(cat "$tmp/err.txt")" "not an HDF5 file" "non-HDF5 error"
expect_failure "$tmp/raw.bin" pt data raw "$tmp/raw.bin" --dtype u16 --vocab 500 -o "$tmp/x.h5"
[[ ! -e "$tmp/x.h5" && ! -e "$tmp/x.h5.tmp" ]] || die "a failed conversion left a file"

# --- under MPI with 2 ranks only rank 0 writes and prints -----------------------------
if [[ -n "${MPIEXEC:-}" ]] && command -v "$MPIEXEC" > /dev/null; then
  out=$(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        OMPI_MCA_rmaps_base_oversubscribe=1 \
        timeout 120 "$MPIEXEC" -n 2 "$PIPETRAIN" data text "$tmp/a.txt" -o "$tmp/mpi.h5")
  [[ "$(head -1 <<<"$out")" == "wrote $tmp/mpi.h5: 17 tokens, vocab 256 (byte), uint16" && $(wc -l <<<"$out") -eq 2 ]] ||
    die "2-rank summary: $out"
fi

echo "data_convert: all checks passed"
