#!/usr/bin/env bash
# End-to-end test of `pipetrain ckpt`: imports a synthetic llm.c GPT-2 model file,
# inspects and verifies the checkpoint, exports it back byte-identical, trains 2 steps
# from it with --init, and checks that a corrupted dataset, a non-HDF5 file, a missing
# file and bad llm.c files each fail with one error line naming the file.
# Env: PIPETRAIN = the executable; SRC = the source tree.
set -euo pipefail
: "${PIPETRAIN:?set PIPETRAIN to the pipetrain executable}" "${SRC:?set SRC to the source directory}"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=tests/cli/lib/expect.sh
source "$(dirname "$0")/lib/expect.sh"
pt() { timeout 120 "$PIPETRAIN" "$@"; }

# write_llmc FILE [VERSION [MAGIC]]: a tiny GPT-2 (L=2, NH=2, C=8, V=50, Vp=128,
# maxT=16) in llm.c's format, parameter i = a distinct value.
write_llmc() {
  python3 - "$@" <<'PY'
import struct, sys
path = sys.argv[1]
version = int(sys.argv[2]) if len(sys.argv) > 2 else 3
magic = int(sys.argv[3]) if len(sys.argv) > 3 else 20240326
L, NH, C, V, Vp, T = 2, 2, 8, 50, 128, 16
n = Vp * C + T * C + L * (2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C + 4 * C * C + C) + 2 * C
header = [magic, version, T, V, L, NH, C, Vp] + [0] * 248
vals = [((i % 4093) - 2046) / 1024.0 + 1.0 / 65536 for i in range(n)]
with open(path, "wb") as f:
    f.write(struct.pack("<256i", *header))
    if version == 5:
        f.write(b"".join(struct.pack("<f", v)[2:] for v in vals))
    else:
        f.write(struct.pack("<%df" % n, *vals))
PY
}

# --- import ---------------------------------------------------------------------------
write_llmc "$tmp/model.bin"
out=$(pt ckpt import-llmc "$tmp/model.bin" -o "$tmp/model.h5")
echo "$out"
expect_contains "$out" "wrote $tmp/model.h5" "import summary"
[[ -f "$tmp/model.h5" && ! -e "$tmp/model.h5.tmp" ]] || die "import output missing or temporary file left"

# --- inspect --------------------------------------------------------------------------
info=$(pt ckpt inspect "$tmp/model.h5")
echo "$info"
expect_contains "$info" "format version 1" "inspect"
expect_contains "$info" "step 0, tokens seen 0, samples seen 0" "inspect"
expect_contains "$info" "grid dp 1 x pp 1 x cp 1 x tp 1, ep 1, zero1 off" "inspect"
expect_contains "$info" "n_layer 2, n_head 2, d_model 8, vocab_size 50 (padded 128), max_seq_len 16" "inspect"
expect_contains "$info" "datasets: 28" "inspect"  # wte, wpe, 2 x 12 per block, lnf.w, lnf.b
[[ "$info" =~ params/wte\ +128x8 ]] || die "inspect: params/wte 128x8 missing"
[[ "$info" =~ params/wpe\ +16x8 ]] || die "inspect: params/wpe 16x8 missing"
[[ "$info" =~ params/h\.1\.attn\.qkv\.w\ +24x8 ]] || die "inspect: params/h.1.attn.qkv.w 24x8 missing"
[[ "$info" =~ params/h\.0\.mlp\.proj\.w\ +8x32 ]] || die "inspect: params/h.0.mlp.proj.w 8x32 missing"
[[ "$info" =~ params/lnf\.b\ +8 ]] || die "inspect: params/lnf.b missing"
[[ "$info" != *adam_m* ]] || die "inspect: an imported checkpoint has no optimizer state"

# --- verify ---------------------------------------------------------------------------
out=$(pt ckpt verify "$tmp/model.h5")
echo "$out"
[[ "$out" == "$tmp/model.h5: 28 datasets verified" ]] || die "verify: $out"

# --- export: byte-identical -----------------------------------------------------------
out=$(pt ckpt export-llmc "$tmp/model.h5" -o "$tmp/back.bin")
echo "$out"
cmp "$tmp/model.bin" "$tmp/back.bin" || die "export is not byte-identical to the imported file"

# --- bf16 (version 5) import, exported as fp32 ---------------------------------------
write_llmc "$tmp/bf16.bin" 5
pt ckpt import-llmc "$tmp/bf16.bin" -o "$tmp/bf16.h5" > /dev/null
pt ckpt export-llmc "$tmp/bf16.h5" -o "$tmp/bf16_back.bin" > /dev/null
python3 - "$tmp/bf16.bin" "$tmp/bf16_back.bin" <<'PY'
import struct, sys
a, b = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read()
assert struct.unpack("<i", b[4:8])[0] == 3, "exported version"
assert a[8:1024] == b[8:1024], "header"
n = (len(a) - 1024) // 2
assert len(b) == 1024 + 4 * n, "exported size"
for i in range(n):
    assert b[1024 + 4 * i:1024 + 4 * i + 4] == b"\0\0" + a[1024 + 2 * i:1024 + 2 * i + 2], i
print(f"bf16 -> fp32: {n} values widened exactly")
PY

# --- training from the imported weights -----------------------------------------------
python3 - "$tmp/tokens.bin" <<'PY'
import struct, sys
open(sys.argv[1], "wb").write(struct.pack("<4000H", *[(i * 7 + i // 13) % 50 for i in range(4000)]))
PY
pt data raw "$tmp/tokens.bin" --dtype u16 --vocab 50 -o "$tmp/tokens.h5"
timeout 300 "$PIPETRAIN" train "$SRC/inputs/austen-char.toml" --init "$tmp/model.h5" \
  --set data.train="$tmp/tokens.h5" --set model.n_layer=2 --set model.n_head=2 --set model.d_model=8 \
  --set model.vocab_size=50 --set model.max_seq_len=16 --set train.seq_len=16 --set train.steps=2 \
  --set train.warmup_steps=0 --set log.every=1 --set checkpoint.dir="$tmp/ckpts" | tee "$tmp/train.txt"
grep -q "initialised the weights from $tmp/model.h5" "$tmp/train.txt" || die "train --init did not load"
grep -q "step     1/2" "$tmp/train.txt" || die "train did not run 2 steps"
# A model of another shape does not load it: the error names the dataset.
expect_failure "params/wte" timeout 300 "$PIPETRAIN" train "$SRC/inputs/austen-char.toml" \
  --init "$tmp/model.h5" --set data.train="$tmp/tokens.h5" --set model.n_layer=2 --set model.n_head=2 \
  --set model.d_model=16 --set model.vocab_size=50 --set model.max_seq_len=16 --set train.seq_len=16 \
  --set train.steps=1

# --- corruption: flip bytes inside wte's data -----------------------------------------
cp "$tmp/model.h5" "$tmp/bad.h5"
python3 - "$tmp/bad.h5" <<'PY'
import struct, sys
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
# wte's values are stored verbatim (no compression): find parameters 100..107 in the file.
needle = struct.pack("<8f", *[((i % 4093) - 2046) / 1024.0 + 1.0 / 65536 for i in range(100, 108)])
at = data.find(needle)
assert at > 0 and data.find(needle, at + 1) < 0, "wte's bytes not found exactly once"
for i in range(at, at + len(needle)):
    data[i] ^= 0x55
open(path, "wb").write(bytes(data))
print(f"corrupted 32 bytes of params/wte at file offset {at}")
PY
rc=0
pt ckpt verify "$tmp/bad.h5" > "$tmp/out.txt" 2> "$tmp/err.txt" || rc=$?
cat "$tmp/out.txt" "$tmp/err.txt"
[[ $rc -ne 0 && $rc -ne 124 ]] || die "verify of a corrupted checkpoint exited $rc"
expect_contains "$(cat "$tmp/out.txt")" "params/wte" "verify's list of bad datasets"
[[ $(grep -c . "$tmp/err.txt") -eq 1 ]] || die "verify: expected one error line"
expect_contains "$(cat "$tmp/err.txt")" "params/wte" "verify error"
expect_contains "$(cat "$tmp/err.txt")" "$tmp/bad.h5" "verify error"
expect_failure "params/wte" pt ckpt export-llmc "$tmp/bad.h5" -o "$tmp/x.bin"
[[ ! -e "$tmp/x.bin" && ! -e "$tmp/x.bin.tmp" ]] || die "a failed export left a file"

# --- errors: one line naming the file, non-zero exit ----------------------------------
expect_failure "$tmp/model.bin" pt ckpt verify "$tmp/model.bin"
expect_contains "$(cat "$tmp/err.txt")" "not an HDF5 file" "non-HDF5 error"
expect_failure "$tmp/model.bin" pt ckpt inspect "$tmp/model.bin"
expect_failure "$tmp/missing.h5" pt ckpt verify "$tmp/missing.h5"
expect_failure "$tmp/missing.h5" pt ckpt inspect "$tmp/missing.h5"
expect_failure "$tmp/missing.h5" pt ckpt export-llmc "$tmp/missing.h5" -o "$tmp/x.bin"
expect_failure "$tmp/tokens.h5" pt ckpt export-llmc "$tmp/tokens.h5" -o "$tmp/x.bin"
expect_contains "$(cat "$tmp/err.txt")" "not a pipetrain checkpoint" "token file as a checkpoint"
write_llmc "$tmp/magic.bin" 3 12345
expect_failure "$tmp/magic.bin" pt ckpt import-llmc "$tmp/magic.bin" -o "$tmp/x.h5"
expect_contains "$(cat "$tmp/err.txt")" "bad magic" "bad-magic error"
write_llmc "$tmp/v7.bin" 7
expect_failure "$tmp/v7.bin" pt ckpt import-llmc "$tmp/v7.bin" -o "$tmp/x.h5"
expect_contains "$(cat "$tmp/err.txt")" "version 7 is not supported" "version error"
cp "$tmp/model.bin" "$tmp/short.bin"
truncate -s -10 "$tmp/short.bin"
expect_failure "$tmp/short.bin" pt ckpt import-llmc "$tmp/short.bin" -o "$tmp/x.h5"
expect_contains "$(cat "$tmp/err.txt")" "truncated" "truncated-file error"
expect_failure "$tmp/missing.bin" pt ckpt import-llmc "$tmp/missing.bin" -o "$tmp/x.h5"
[[ ! -e "$tmp/x.h5" && ! -e "$tmp/x.h5.tmp" ]] || die "a failed import left a file"

echo "ckpt_cmd: all checks passed"
