#!/usr/bin/env bash
# Benchmark: tokens/s of `pipetrain data text --tokenizer gpt2` on one core against
# OpenAI's tiktoken (npm `tiktoken`, WASM) on the same text in the same run.
#
#   bash bench/bench_tokenizer.sh [BUILD_DIR (build)] [COPIES of inputs/austen.txt (16)]
#
# The oracle is installed as tests/cli/tokenizer_oracle.sh installs it (into BUILD_DIR/oracle).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$src/build}
copies=${2:-16}
pt="$build/bin/pipetrain"
oracle="$build/oracle/tiktoken"
if [ ! -d "$oracle/node_modules/tiktoken" ]; then
  mkdir -p "$oracle"
  (cd "$oracle" && npm install --no-audit --no-fund --silent tiktoken@1)
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for _ in $(seq "$copies"); do cat "$src/inputs/austen.txt"; done >"$work/corpus.txt"
mib=$(du -m "$work/corpus.txt" | cut -f1)
echo "corpus: inputs/austen.txt x $copies = $mib MiB; one core (taskset -c 0)"
taskset -c 0 "$pt" data text "$work/corpus.txt" -o "$work/c.h5" --tokenizer gpt2 | tail -1
# shellcheck disable=SC2016  # JavaScript, not shell
NODE_PATH="$oracle/node_modules" taskset -c 0 node -e '
const { get_encoding } = require("tiktoken");
const text = require("fs").readFileSync(process.argv[1], "utf8");
const enc = get_encoding("gpt2");
const t0 = process.hrtime.bigint();
const n = enc.encode_ordinary(text).length;
const s = Number(process.hrtime.bigint() - t0) / 1e9;
console.log(`tiktoken (npm, WASM): ${n} tokens in ${s.toFixed(2)} s: ${(n / s).toFixed(0)} tokens/s (encode_ordinary of the whole text, file read excluded)`);
enc.free();' "$work/corpus.txt"
