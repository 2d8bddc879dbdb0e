#!/usr/bin/env bash
# The GPT-2, cl100k_base and o200k_base tokenizers against OpenAI's tiktoken (npm
# `tiktoken`; skipped without it): identical token ids on the bundled corpus and a
# Unicode-heavy sample (accents, CJK, emoji, numbers, contractions, runs of every kind of whitespace),
# decode(encode(x)) == x with both, and `data text --tokenizer gpt2` stores those ids.
# Special tokens: each encoding's ids as tiktoken's (`data encode --allow-special` against
# encode(text, "all") on a text spelling each), ordinary text where not asked for, the
# vocabulary they end, and `data text --eot` storing cl100k_base's <|endoftext|>.
set -euo pipefail
: "${PIPETRAIN:?}" "${SRC:?}"
# The oracle: npm's tiktoken, where scripts/test.sh installs it (build/oracle), or
# PIPETRAIN_TIKTOKEN_DIR (a folder holding node_modules/tiktoken).
oracle=${PIPETRAIN_TIKTOKEN_DIR:-$(dirname "$PIPETRAIN")/../oracle/tiktoken}
if ! command -v node >/dev/null || [ ! -d "$oracle/node_modules/tiktoken" ]; then
  echo "SKIP: the oracle is missing: node and npm's tiktoken in $oracle (scripts/test.sh installs it: npm install tiktoken@1)"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tmp=$work
source "$SRC/tests/cli/lib/expect.sh"
export NODE_PATH="$oracle/node_modules"
js="$SRC/tests/reference/tiktoken_encode.js"
samples=("$SRC/inputs/austen.txt" "$SRC/tests/data/unicode_sample.txt")
for f in "${samples[@]}"; do
  name=$(basename "$f")
  node "$js" "$f" >"$work/$name.tiktoken"
  "$PIPETRAIN" data encode "$f" --tokenizer gpt2 >"$work/$name.pipetrain"
  if ! cmp -s "$work/$name.tiktoken" "$work/$name.pipetrain"; then
    echo "FAIL: $name: pipetrain's gpt2 ids differ from tiktoken's"
    /usr/bin/env python3 - "$work/$name.tiktoken" "$work/$name.pipetrain" <<'PY' || true
import sys
a, b = (open(p).read().split() for p in sys.argv[1:3])
i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
print(f"  {len(a)} vs {len(b)} ids; first difference at id {i}: tiktoken {a[max(0,i-3):i+4]} pipetrain {b[max(0,i-3):i+4]}")
PY
    exit 1
  fi
  "$PIPETRAIN" data decode --tokenizer gpt2 <"$work/$name.pipetrain" >"$work/$name.back"
  cmp -s "$work/$name.back" "$f" || { echo "FAIL: $name: pipetrain's decode(encode(text)) differs from the text"; exit 1; }
  echo "ok: $name: $(wc -w <"$work/$name.pipetrain") ids identical to tiktoken's; decode(encode(x)) == x"
done
node "$js" --decode "${samples[@]}"
echo "ok: tiktoken's decode(encode(x)) == x on both"

# cl100k_base and o200k_base: their ranks as tiktoken's own package holds them, written as
# .tiktoken files; pipetrain splits the text with each encoding's pattern (named by the
# file) and must give tiktoken's ids on the same corpus.
for enc in cl100k_base o200k_base; do
  node "$js" --encoding "$enc" --ranks "$work/$enc.tiktoken"
  for f in "${samples[@]}"; do
    name=$(basename "$f")
    node "$js" --encoding "$enc" "$f" >"$work/$name.$enc.want"
    "$PIPETRAIN" data encode "$f" --tokenizer "$work/$enc.tiktoken" >"$work/$name.$enc.got"
    cmp -s "$work/$name.$enc.want" "$work/$name.$enc.got" ||
      { echo "FAIL: $name: pipetrain's $enc ids differ from tiktoken's"; exit 1; }
    echo "ok: $name: $(wc -w <"$work/$name.$enc.got") $enc ids identical to tiktoken's"
  done
done
# The same ranks under another name: the pattern must be said, and a wrong one differs.
# PATTERN names the encoding too: cl100k_base's rank 50256 is GPT-2's <|endoftext|>, so
# under gpt2 the file is refused; without that rank it loads.
cp "$work/cl100k_base.tiktoken" "$work/ranks.tiktoken"
expect_failure "which pre-tokenizer pattern" "$PIPETRAIN" data encode "${samples[1]}" --tokenizer "$work/ranks.tiktoken"
expect_failure "rank 50256 is the id of gpt2's special token <|endoftext|>" \
  "$PIPETRAIN" data encode "${samples[1]}" --tokenizer "gpt2:$work/ranks.tiktoken"
grep -v ' 50256$' "$work/cl100k_base.tiktoken" >"$work/ranks.tiktoken"
"$PIPETRAIN" data encode "${samples[1]}" --tokenizer "gpt2:$work/ranks.tiktoken" >"$work/wrong.ids"
if cmp -s "$work/wrong.ids" "$work/unicode_sample.txt.cl100k_base.want"; then
  echo "FAIL: GPT-2's pattern gave cl100k_base's ids: the sample cannot tell the patterns apart"; exit 1
fi
echo "ok: a ranks file of unknown pattern is refused, and one ranking a special id; GPT-2's pattern gives other ids"

# Special tokens: a text spelling each one of the encoding (and a broken one) gives
# tiktoken's ids with --allow-special, encode_ordinary's without (no special id among them),
# and decodes back; the vocabulary (`data text`'s) ends after the last special id.
printf 'x' >"$work/x.txt"
for enc in gpt2 cl100k_base o200k_base; do
  tok=$work/$enc.tiktoken
  if [ "$enc" = gpt2 ]; then tok=gpt2; fi
  text=$work/$enc.special.txt
  node "$js" --encoding "$enc" --specials "$text" >"$work/$enc.special.ids"
  node "$js" --encoding "$enc" --allow-special "$text" >"$work/$enc.special.want"
  "$PIPETRAIN" data encode "$text" --allow-special --tokenizer "$tok" >"$work/$enc.special.got"
  cmp -s "$work/$enc.special.want" "$work/$enc.special.got" ||
    { echo "FAIL: $enc: special tokens' ids: tiktoken $(cat "$work/$enc.special.want"), pipetrain $(cat "$work/$enc.special.got")"; exit 1; }
  node "$js" --encoding "$enc" "$text" >"$work/$enc.ordinary.want"
  "$PIPETRAIN" data encode "$text" --tokenizer "$tok" >"$work/$enc.ordinary.got"
  cmp -s "$work/$enc.ordinary.want" "$work/$enc.ordinary.got" ||
    { echo "FAIL: $enc: a text spelling special tokens, encoded without --allow-special, differs from encode_ordinary's"; exit 1; }
  while read -r special id; do
    if grep -qw "$id" "$work/$enc.ordinary.got"; then echo "FAIL: $enc: ordinary text gave $special's id $id"; exit 1; fi
    [ "$("$PIPETRAIN" data decode --tokenizer "$tok" "$id")" = "$special" ] || { echo "FAIL: $enc: decode($id) is not $special"; exit 1; }
  done <"$work/$enc.special.ids"
  "$PIPETRAIN" data decode --tokenizer "$tok" <"$work/$enc.special.got" | cmp -s - "$text" ||
    { echo "FAIL: $enc: decode of the special ids is not the text"; exit 1; }
  vocab=$(($(cut -d' ' -f2 "$work/$enc.special.ids" | sort -n | tail -n1) + 1))
  "$PIPETRAIN" data text "$work/x.txt" -o "$work/$enc.x.h5" --tokenizer "$tok" >/dev/null
  grep -q "vocab_size $vocab," <<<"$("$PIPETRAIN" data info "$work/$enc.x.h5")" ||
    { echo "FAIL: $enc: the vocabulary is not $vocab: $("$PIPETRAIN" data info "$work/$enc.x.h5")"; exit 1; }
  echo "ok: $enc: $(wc -l <"$work/$enc.special.ids") special tokens' ids as tiktoken's, ordinary text without --allow-special, vocabulary $vocab"
done

# `data text --eot` with cl100k_base: its <|endoftext|> (tiktoken's id) after each file.
eot=$(awk '$1 == "<|endoftext|>" { print $2 }' "$work/cl100k_base.special.ids")
"$PIPETRAIN" data text "${samples[@]}" -o "$work/cl.h5" --tokenizer "cl100k_base:$work/cl100k_base.tiktoken" --eot >/dev/null
h5dump -d /tokens -y -w 0 "$work/cl.h5" | tr -cs '0-9' ' ' | tr ' ' '\n' | sed '/^$/d' >"$work/cl.ids"
{ tr ' ' '\n' <"$work/austen.txt.cl100k_base.want"; echo "$eot"; tr ' ' '\n' <"$work/unicode_sample.txt.cl100k_base.want"; echo "$eot"; } \
  | sed '/^$/d' >"$work/cl.expected"
tail -n "$(wc -l <"$work/cl.expected")" "$work/cl.ids" | cmp -s - "$work/cl.expected" ||
  { echo "FAIL: data text --tokenizer cl100k_base --eot did not store tiktoken's ids with $eot after each file"; exit 1; }
echo "ok: data text --tokenizer cl100k_base --eot stores tiktoken's ids and <|endoftext|> $eot after each file"

# The dataset holds the same ids, with an end-of-text token (50256) after each file.
"$PIPETRAIN" data text "${samples[@]}" -o "$work/t.h5" --tokenizer gpt2 --eot >"$work/text.out"
grep -q "tokenizer" "$work/text.out" || { echo "FAIL: data text printed no summary"; cat "$work/text.out"; exit 1; }
h5dump -d /tokens -y -w 0 "$work/t.h5" | tr -cs '0-9' ' ' | tr ' ' '\n' | sed '/^$/d' >"$work/t.ids"
{ tr ' ' '\n' <"$work/austen.txt.tiktoken"; echo 50256; tr ' ' '\n' <"$work/unicode_sample.txt.tiktoken"; echo 50256; } \
  | sed '/^$/d' >"$work/expected.ids"
# h5dump's header numbers come first: compare the tail that holds the data.
n=$(wc -l <"$work/expected.ids")
tail -n "$n" "$work/t.ids" | cmp -s - "$work/expected.ids" || { echo "FAIL: data text --tokenizer gpt2 stored other ids"; exit 1; }
grep -q "tokenizer gpt2" <<<"$("$PIPETRAIN" data info "$work/t.h5")" || { echo "FAIL: the dataset does not record tokenizer gpt2"; exit 1; }
echo "ok: data text --tokenizer gpt2 --eot stores tiktoken's ids and records the tokenizer"

# Bad input: one line naming the file.
printf 'ok \xff\xfe bad' >"$work/bad.txt"
expect_failure "not valid UTF-8" "$PIPETRAIN" data text "$work/bad.txt" -o "$work/bad.h5" --tokenizer gpt2
[[ ! -e "$work/bad.h5" && ! -e "$work/bad.h5.tmp" ]] || { echo "FAIL: a failed tokenization left a file behind"; exit 1; }
expect_failure "expected byte, gpt2, or PATTERN:RANKS_FILE" "$PIPETRAIN" data text "${samples[1]}" -o "$work/x.h5" --tokenizer nope
expect_failure "no end-of-text token" "$PIPETRAIN" data text "${samples[1]}" -o "$work/x.h5" --eot
echo "ok: bad input fails with one line naming it"
