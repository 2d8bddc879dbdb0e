#!/usr/bin/env bash
# `pipetrain report`: a tiny 2-rank pipeline run with log.dir becomes one HTML page with
# inline SVG plots and timelines; a missing run directory is a one-line error. When
# chromium is installed, the page also loads headless, renders to a PNG, and its DOM holds
# the plot titles.
set -euo pipefail
: "${PIPETRAIN:?}" "${SRC:?}" "${MPIEXEC:?}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

head -c 200000 "$SRC/inputs/austen.txt" >"$tmp/corpus.txt"
timeout 120 "$PIPETRAIN" data text "$tmp/corpus.txt" -o "$tmp/corpus.h5"
timeout 600 "$MPIEXEC" -np 2 "$PIPETRAIN" train "$SRC/inputs/austen-char.toml" \
  --set data.train="$tmp/corpus.h5" --set data.val="$tmp/corpus.h5" --set train.eval_every=4 \
  --set parallel.pp=2 --set model.n_layer=2 --set model.d_model=64 --set train.seq_len=32 \
  --set model.max_seq_len=32 --set train.steps=8 --set log.every=4 --set log.peak_flops=1e11 \
  --set log.dir="$tmp/run" >"$tmp/train.txt"
for f in run.json config.toml metrics.jsonl schedule_sim.json trace.json; do
  test -s "$tmp/run/$f" || { echo "missing $tmp/run/$f"; exit 1; }
done

timeout 60 "$PIPETRAIN" report "$tmp/run" | tee "$tmp/report.txt"
grep -q "wrote $tmp/run/report.html" "$tmp/report.txt"
html="$tmp/run/report.html"
test -s "$html"
grep -q "<svg" "$html"
for title in "Loss vs step" "Loss vs tokens" "Throughput vs step" "Learning rate vs step" \
  "Bubble fraction and MFU vs step" "Measured timeline, step 7" "Simulated timeline, 1f1b"; do
  grep -qF ">$title" "$html" || { echo "no '$title' in the page"; exit 1; }
done
if grep -qi "<script" "$html"; then echo "the page has a script"; exit 1; fi
# -o elsewhere works too.
timeout 60 "$PIPETRAIN" report "$tmp/run" -o "$tmp/other.html" >/dev/null
cmp -s "$html" "$tmp/other.html"

# Errors: one line naming the path.
if "$PIPETRAIN" report "$tmp/no-such-run" 2>"$tmp/err.txt"; then echo "expected a failure"; exit 1; fi
grep -q "pipetrain: error: report: $tmp/no-such-run is not a run directory" "$tmp/err.txt"
mkdir "$tmp/empty"
if "$PIPETRAIN" report "$tmp/empty" 2>"$tmp/err.txt"; then echo "expected a failure"; exit 1; fi
grep -q "$tmp/empty/metrics.jsonl" "$tmp/err.txt"
test "$(wc -l <"$tmp/err.txt")" -eq 1

if ! command -v chromium >/dev/null 2>&1; then
  echo "SKIP: the browser check: chromium is not installed (Debian: chromium; scripts/test.sh installs it); the page checks passed"
  exit 77
fi
chrome=(chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run
  --disable-background-networking --disable-component-update --disable-sync)
start=$(date +%s%N)
timeout 120 "${chrome[@]}" --user-data-dir="$(mktemp -d -p "$tmp")" --screenshot="$tmp/report.png" \
  --window-size=1400,3000 "file://$html" >"$tmp/chromium.txt" 2>&1 || { cat "$tmp/chromium.txt"; exit 1; }
test -s "$tmp/report.png" || { cat "$tmp/chromium.txt"; echo "no screenshot"; exit 1; }
head -c 8 "$tmp/report.png" | od -An -tx1 | grep -q "89 50 4e 47" || { echo "not a PNG"; exit 1; }
timeout 120 "${chrome[@]}" --user-data-dir="$(mktemp -d -p "$tmp")" --dump-dom "file://$html" \
  >"$tmp/dom.html" 2>"$tmp/chromium.txt" || { cat "$tmp/chromium.txt"; exit 1; }
for title in "Loss vs step" "Throughput vs step" "Measured timeline" "Simulated timeline"; do
  grep -qF "$title" "$tmp/dom.html" || { echo "the rendered DOM has no '$title'"; exit 1; }
done
grep -q "<svg" "$tmp/dom.html"
echo "chromium: screenshot and DOM of the page in $((($(date +%s%N) - start) / 1000000)) ms"
