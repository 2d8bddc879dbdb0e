#!/usr/bin/env bash
# data.pack_documents end to end: `data text --eot` writes one document per input file
# (GPT-2's end-of-text after each); a packed run on a 2-stage pipeline says in its header
# how many tokens the file holds (the integer `data info` gives), how the documents were
# packed and that the long ones were split, its losses and gradient norms over 6 steps
# without warm-up (and those of cp = 2, documents spanning the two ranks' chunks) equal the
# single rank's packed run, and
# it evaluates packed validation data. Bad input: a file
# whose tokenizer has no end-of-text token, and data.respect_documents beside packing, are
# one-line errors naming the file or the keys.
set -euo pipefail
: "${PIPETRAIN:?}" "${SRC:?}" "${MPIEXEC:?}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

source "$(dirname "$0")/lib/expect.sh"
fail() { echo "FAIL: $*"; exit 1; }

# 40 documents of 20 to 332 bytes (about 5 to 80 tokens) from the corpus: most sequences of
# 64 hold several, so masking between them matters from the first step; a few are split.
python3 - "$SRC/inputs/austen.txt" "$tmp" <<'PY'
import sys
text, at = open(sys.argv[1], "rb").read(), 0
for i in range(1, 41):
    n = (i * 37) % 40 * 8 + 20
    open(f"{sys.argv[2]}/doc{i}.txt", "wb").write(text[at:at + n])
    at += n
PY
docs=()
for i in $(seq 1 40); do docs+=("$tmp/doc$i.txt"); done
timeout 120 "$PIPETRAIN" data text "${docs[@]}" -o "$tmp/docs.h5" --tokenizer gpt2 --eot >/dev/null

common=(--set data.train="$tmp/docs.h5" --set data.pack_documents=true --set model.vocab_size=50304
        --set model.n_layer=2 --set model.d_model=32 --set model.n_head=2 --set train.seq_len=64
        --set model.max_seq_len=64 --set train.global_batch=4 --set train.microbatches=2 --set train.steps=6
        --set train.warmup_steps=0 --set train.lr=1e-2 --set train.lr_schedule=constant
        --set data.sampling=sequential --set log.every=1 --set data.val="$tmp/docs.h5" --set train.eval_every=3)
timeout 300 "$PIPETRAIN" train "$SRC/inputs/austen-char.toml" "${common[@]}" --metrics "$tmp/one.jsonl" >"$tmp/one.out"
timeout 300 "$MPIEXEC" -np 2 "$PIPETRAIN" train "$SRC/inputs/austen-char.toml" "${common[@]}" --set parallel.pp=2 \
  --metrics "$tmp/pp2.jsonl" >"$tmp/pp2.out"
timeout 300 "$MPIEXEC" -np 2 "$PIPETRAIN" train "$SRC/inputs/austen-char.toml" "${common[@]}" --set parallel.cp=2 \
  --metrics "$tmp/cp2.jsonl" >"$tmp/cp2.out"
line=$(grep -m1 "documents packed into" "$tmp/one.out") || fail "no packing line in the header: $(head -40 "$tmp/one.out")"
echo "$line"
[[ $line =~ \(40\ documents\ packed\ into\ [0-9]+\ sequences\ of\ 64,\ [0-9]+%\ of\ positions\ filled,\ ([0-9]+)\ longer\ than\ seq_len\ split ]] ||
  fail "the packing line: $line"
[ "${BASH_REMATCH[1]}" -gt 0 ] || fail "no document was split"
tokens=$("$PIPETRAIN" data info "$tmp/docs.h5" | sed -E 's/.*: tokens ([0-9]+),.*/\1/')
[[ $line == *"  data $tokens tokens (40 documents packed"* ]] || fail "the header's token count is not the file's $tokens: $line"
# Compared on every step's loss and gradient norm, with no warm-up and lr 1e-2, so that by
# the last steps the model has left ln(50257) and a masking mistake (a document seeing the
# one before it, a position not restarted) moves the gradients, not only a loss near ln V.
python3 - "$tmp/one.jsonl" "$tmp/pp2.jsonl" "$tmp/cp2.jsonl" <<'PY'
import json, math, sys
names = ("pp = 2", "cp = 2")
one, *others = ([json.loads(l) for l in open(p)] for p in sys.argv[1:4])
assert one[-1]["loss"] < math.log(50257) - 1.0, f"the model has not moved from ln(50257): {one[-1]['loss']}"
for name, other in zip(names, others):
    assert len(one) == len(other) == 6, (name, len(one), len(other))
    for a, b in zip(one, other):
        assert math.isfinite(a["loss"]), a
        # the same sums in another order: f32 rounding (relative ~1e-6), far below 1e-4
        for key in ("loss", "grad_norm", "val_loss"):
            if key in a:
                assert abs(a[key] - b[key]) <= 1e-4 * a[key], (name, "step", a["step"], key, a[key], b[key])
vals = [r["val_loss"] for r in one if "val_loss" in r]
assert len(vals) == 2 and all(math.isfinite(v) for v in vals), one
print("packed losses", [round(r["loss"], 4) for r in one], "gradient norms", [round(r["grad_norm"], 4) for r in one],
      "validation", [round(v, 4) for v in vals])
PY

timeout 60 "$PIPETRAIN" data text "$tmp/doc1.txt" -o "$tmp/bytes.h5" >/dev/null
check_failure no-eot one "bytes.h5" "end-of-text" -- \
  "$PIPETRAIN" train "$SRC/inputs/austen-char.toml" --set data.train="$tmp/bytes.h5" --set data.pack_documents=true || true
check_failure both-keys one "data.respect_documents" "data.pack_documents" -- \
  "$PIPETRAIN" train "$SRC/inputs/austen-char.toml" --set data.train="$tmp/docs.h5" --set data.pack_documents=true \
  --set data.respect_documents=true --set model.vocab_size=50304 || true
exit_with_failures
echo "packed documents: end to end passed"
