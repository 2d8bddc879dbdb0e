#!/usr/bin/env bash
# bench_llmc_gpt2.sh LLMC_DIR [B] [T] [STEPS]: llm.c's CPU trainer (train_gpt2.c), the
# plain C reference of pipetrain's GPT-2 throughput comparison, at pipetrain's benchmark
# shapes (B x T tokens a step, default 4 x 256), one thread.
#
# LLMC_DIR is a checkout of github.com/karpathy/llm.c (not in Debian: read, built here,
# never copied into pipetrain). train_gpt2.c fixes B = 4, T = 64 and 40 steps in main():
# a copy with those three numbers replaced is built with `-O3 -march=native -fopenmp`
# (llm.c's own flags). Its inputs are made here: a shard of random tokens in llm.c's
# format, and GPT-2 124M's weights after one pipetrain step on them, exported as an llm.c
# checkpoint (`pipetrain ckpt export-llmc`). Prints llm.c's per-step lines and the median
# step's tokens/s (its first step, a warm-up, left out).
set -euo pipefail
llmc=${1:?usage: bench_llmc_gpt2.sh LLMC_DIR [B] [T] [STEPS]}
B=${2:-4}
T=${3:-256}
STEPS=${4:-5}
here=$(cd "$(dirname "$0")/.." && pwd)
pipetrain=${PIPETRAIN:-$here/build/bin/pipetrain}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/dev/data/tinyshakespeare" "$work/llmc"
cp -r "$llmc/llmc/." "$work/llmc/"
sed -e "s/int B = 4;/int B = $B;/" -e "s/int T = 64;/int T = $T;/" \
  -e "s/step <= 40;/step <= $STEPS;/" "$llmc/train_gpt2.c" >"$work/train_gpt2.c"
grep -q "int T = $T;" "$work/train_gpt2.c" || { echo "train_gpt2.c's main() has changed: set B and T by hand" >&2; exit 1; }
(cd "$work" && gcc -O3 -march=native -fopenmp -Ofast -Wno-unused-result train_gpt2.c -lm -o train_gpt2)

# Random tokens in llm.c's shard format: 256 int32 header (magic, version 1, count), uint16 tokens.
/usr/bin/python3 - "$work/dev/data/tinyshakespeare" "$B" "$T" "$STEPS" <<'PY'
import random, struct, sys
out, B, T, steps = sys.argv[1], *map(int, sys.argv[2:])
random.seed(0)
for name, n in (("train", (steps + 2) * B * T + 1), ("val", 6 * B * T + 1)):
    with open(f"{out}/tiny_shakespeare_{name}.bin", "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(struct.pack(f"<{n}H", *(random.randrange(50257) for _ in range(n))))
PY
# GPT-2 124M's weights from pipetrain (one step from its initialisation, on the same
# tokens), exported for llm.c.
"$pipetrain" data llmc "$work/dev/data/tinyshakespeare/tiny_shakespeare_train.bin" -o "$work/tokens.h5" >/dev/null
OPENBLAS_NUM_THREADS=1 "$pipetrain" train "$here/inputs/gpt2-124m.toml" --set data.train="$work/tokens.h5" \
  --set train.seq_len="$T" --set train.global_batch="$B" --set train.microbatches=1 \
  --set train.steps=1 --set parallel.dp=1 --set parallel.pp=1 --set checkpoint.dir="$work/ckpt" \
  --set checkpoint.every=1 --set log.progress=false >/dev/null
checkpoints=("$work"/ckpt/*.h5)
"$pipetrain" ckpt export-llmc "${checkpoints[-1]}" -o "$work/gpt2_124M.bin" >/dev/null
cd "$work"
OMP_NUM_THREADS=1 ./train_gpt2 | tee run.log | grep -E "^step|num_parameters" || true
# The median of the timed steps (llm.c prints "step N: train loss L (took MS ms)").
ms=$(sed -n 's/^step \([0-9]*\): train loss .* (took \([0-9.]*\) ms)$/\1 \2/p' run.log | awk '$1 > 0 {print $2}' | sort -n)
n=$(echo "$ms" | grep -c . || true)
[ "$n" -ge 1 ] || { echo "llm.c ran no timed step" >&2; exit 1; }
median=$(echo "$ms" | awk -v n="$n" 'NR == int((n + 1) / 2) {a = $1} NR == int(n / 2) + 1 {b = $1} END {print (a + b) / 2}')
awk -v ms="$median" -v B="$B" -v T="$T" -v n="$n" 'BEGIN {
  printf "llm.c: median of %d steps %.1f ms, %.1f tokens/s (%d x %d tokens, one thread)\n", n, ms, B * T / ms * 1000, B, T }'
