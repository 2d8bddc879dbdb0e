#!/usr/bin/env bash
# Megatron-LM indexed datasets, written here by an independent Python writer of the
# MMIDIDX format: training straight from the prefix gives the losses of training from the
# same tokens converted to HDF5 (`data megatron`), and each malformed file fails in one line
# naming it.
set -euo pipefail
: "${PIPETRAIN:?}" "${SRC:?}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$SRC/tests/cli/lib/expect.sh"

# PREFIX CODE [truncate]: the bundled corpus's bytes as tokens, one document per paragraph.
write_megatron() {
  python3 - "$SRC/inputs/austen.txt" "$1" "$2" "${3:-}" <<'PY'
import struct, sys
text, prefix, code, cut = open(sys.argv[1], "rb").read()[:200000], sys.argv[2], int(sys.argv[3]), sys.argv[4]
fmt = {1: "B", 2: "b", 3: "h", 4: "i", 5: "q", 8: "H"}[code]
docs = [d + b"\n\n" for d in text.split(b"\n\n") if d]
lengths, pointers, at = [], [], 0
with open(prefix + ".bin", "wb") as bin:
    for d in docs:
        bin.write(struct.pack("<%d%s" % (len(d), fmt), *d))
        lengths.append(len(d)); pointers.append(at); at += len(d) * struct.calcsize(fmt)
with open(prefix + ".idx", "wb") as idx:
    idx.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, code, len(lengths), len(lengths) + 1))
    idx.write(struct.pack("<%di" % len(lengths), *lengths))
    idx.write(struct.pack("<%dq" % len(pointers), *pointers))
    idx.write(struct.pack("<%dq" % (len(lengths) + 1), *range(len(lengths) + 1)))
if cut:
    import os
    os.truncate(prefix + ".bin", at - 7)
PY
}

train() {  # DATA [extra --set]...: 3 steps of a tiny model; prints the step losses
  timeout 300 "$PIPETRAIN" train "$SRC/inputs/austen-char.toml" --set data.train="$1" --set train.steps=3 \
    --set model.n_layer=1 --set model.d_model=32 --set model.n_head=2 --set train.seq_len=32 \
    --set model.max_seq_len=32 --set log.every=1 --set log.progress=false "${@:2}" | grep -o "loss [0-9.]*"
}

write_megatron "$tmp/u16" 8
"$PIPETRAIN" data megatron "$tmp/u16" -o "$tmp/u16.h5" --vocab 256 --tokenizer byte | tee "$tmp/conv.txt"
grep -q "tokens, vocab 256 (byte), uint16" "$tmp/conv.txt" || { echo "FAIL: conversion summary"; exit 1; }
direct=$(train "$tmp/u16")
converted=$(train "$tmp/u16.h5")
[[ -n "$direct" && "$direct" == "$converted" ]] || { echo "FAIL: losses differ: prefix [$direct] vs HDF5 [$converted]"; exit 1; }
echo "ok: training from the prefix and from its HDF5 conversion: identical losses ($(echo "$direct" | tr '\n' ' '))"
write_megatron "$tmp/i32" 4
[[ "$(train "$tmp/i32")" == "$direct" ]] || { echo "FAIL: int32 tokens give other losses"; exit 1; }
echo "ok: int32 tokens: the same losses"
docs=$(train "$tmp/u16" --set data.respect_documents=true)
[[ -n "$docs" && "$docs" != "$direct" ]] || { echo "FAIL: data.respect_documents changed nothing"; exit 1; }
echo "ok: data.respect_documents = true draws other windows"

write_megatron "$tmp/short" 8 truncate
expect_failure "short.bin: " "$PIPETRAIN" data megatron "$tmp/short" -o "$tmp/x.h5"
expect_contains "$(cat "$tmp/err.txt")" "(truncated)" "truncated .bin"
printf 'NOTMAGIC!xxxxxxxxxxxxxxxxxxxxxxxx' >"$tmp/junk.idx"
expect_failure "junk.idx: not a Megatron index" "$PIPETRAIN" data megatron "$tmp/junk" -o "$tmp/x.h5"
check_failure vocab ranks "u16: token" "model.vocab_size 64" -- train "$tmp/u16" --set model.vocab_size=64
exit_with_failures
echo "ok: malformed files fail in one line naming the file"
