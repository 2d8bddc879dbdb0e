#!/usr/bin/env bash
# End-to-end test of `pipetrain schedule`: the 1F1B bubble 3/11 as JSON; a --csv dump
# re-read with --file gives the same JSON; --svg and --trace files are written and the
# trace parses as JSON; every listed built-in runs; the sample files in
# inputs/schedules/ validate; an unknown name, a broken CSV and a deadlocked CSV exit
# non-zero with one error line.
# Env: PIPETRAIN = the executable; SRC (optional) = the source tree (for inputs/).
set -euo pipefail
: "${PIPETRAIN:?set PIPETRAIN to the pipetrain executable}"
SRC=${SRC:-$(cd "$(dirname "$0")/../.." && pwd)}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=tests/cli/lib/expect.sh
source "$(dirname "$0")/lib/expect.sh"
pt() { timeout 60 "$PIPETRAIN" "$@"; }


# 1F1B, 4 ranks, 8 microbatches, F=1 B=2: makespan 33, bubble 3/11, peaks 4 3 2 1.
json=$(pt schedule 1f1b --ranks 4 --microbatches 8 --json)
echo "1f1b: $json"
python3 - "$json" <<'PY'
import json, sys
j = json.loads(sys.argv[1])
assert set(j) == {"makespan", "bubble_fraction", "peak_inflight"}, j
assert abs(j["bubble_fraction"] - 3 / 11) < 1e-9, j
assert abs(j["makespan"] - 33) < 1e-9, j
assert j["peak_inflight"] == [4, 3, 2, 1], j
PY

# The human-readable report.
text=$(pt schedule 1f1b --ranks 4 --microbatches 8)
expect_contains "$text" "rank 3" "text grid"
expect_contains "$text" "0F0" "text grid"
expect_contains "$text" "bubble fraction: 0.2727" "text report"
expect_contains "$text" "peak in-flight per rank: 4 3 2 1" "text report"

# Dump as CSV, re-read with --file: same schedule, same JSON.
pt schedule 1f1b --ranks 4 --microbatches 8 --csv "$tmp/1f1b.csv" --json > /dev/null
[[ -s "$tmp/1f1b.csv" ]] || die "--csv wrote nothing"
[[ $(wc -l < "$tmp/1f1b.csv") -eq 4 ]] || die "--csv: expected 4 rows"
again=$(pt schedule --file "$tmp/1f1b.csv" --json)
[[ "$again" == "$json" ]] || die "--file re-read: $again != $json"
# The same for a V-placed schedule with virtual stages and split backward.
zbv=$(pt schedule zbv --ranks 4 --stages 8 --microbatches 8 --csv "$tmp/zbv.csv" --json)
zbv_again=$(pt schedule --file "$tmp/zbv.csv" --placement v --json)
[[ "$zbv" == "$zbv_again" ]] || die "zbv re-read: $zbv_again != $zbv"
expect_failure "wrong rank" pt schedule --file "$tmp/zbv.csv" --placement loop

# SVG and Chrome trace.
pt schedule interleaved-1f1b --ranks 4 --stages 8 --microbatches 8 --costs 1,1,1 \
  --svg "$tmp/s.svg" --trace "$tmp/s.json" > "$tmp/report.txt"
grep -q "<svg" "$tmp/s.svg" || die "--svg: no <svg> in $tmp/s.svg"
grep -q "</svg>" "$tmp/s.svg" || die "--svg: unterminated"
python3 - "$tmp/s.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
x = [e for e in doc["traceEvents"] if e["ph"] == "X"]
assert len(x) == 4 * 8 * 2 * 2, len(x)  # stages*microbatches*(F+B) = 8*8*2
assert {e["tid"] for e in x} == {0, 1, 2, 3}
assert all(e["dur"] > 0 for e in x)
PY

# Every listed schedule runs with parameters it accepts.
list=$(pt schedule --list)
for name in gpipe 1f1b interleaved-1f1b looped-bfs zb-h1 zbv dualpipev; do
  expect_contains "$list" "$name" "--list"
done
for spec in "gpipe 4" "1f1b 4" "interleaved-1f1b 8" "looped-bfs 8" "zb-h1 4" "zbv 8" "dualpipev 8"; do
  read -r name stages <<< "$spec"
  out=$(pt schedule "$name" --ranks 4 --stages "$stages" --microbatches 8 --costs 1,1,1 --json)
  echo "$name: $out"
done

# The sample schedule files.
pt schedule --file "$SRC/inputs/schedules/1f1b-4x8.csv" --json > "$tmp/sample.json"
[[ "$(cat "$tmp/sample.json")" == "$json" ]] || die "1f1b-4x8.csv differs from the built-in"
pt schedule --file "$SRC/inputs/schedules/zb-h1-3x4-hand.csv" > /dev/null
pt schedule --file "$SRC/inputs/schedules/zbv-2x4.csv" --placement v > /dev/null

# The lowered program (PyTorch compute_comms CSV): written, read back, the same schedule.
pt schedule zbv --ranks 2 --stages 4 --microbatches 4 --csv "$tmp/zbv-lowered.csv" --lowered > /dev/null
expect_contains "$(cat "$tmp/zbv-lowered.csv")" "0F0,0SEND_F0" "lowered CSV"
expect_contains "$(cat "$tmp/zbv-lowered.csv")" "1RECV_F0" "lowered CSV"
[[ "$(pt schedule --file "$tmp/zbv-lowered.csv" --placement v --json)" == "$(pt schedule zbv --ranks 2 --stages 4 --microbatches 4 --json)" ]] \
  || die "the lowered zbv file simulates differently from the built-in"
printf '0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n1F0,1RECV_F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1\n' \
  > "$tmp/misordered.csv"
expect_failure "rank 1, position 1 (1F0): no receive of its input from rank 0 is posted before it" \
  pt schedule --file "$tmp/misordered.csv"

# Vocabulary parallelism: the program with its slices and collectives, validated and
# simulated; the output layer spread over the ranks beats it whole on the last stage.
out=$(pt schedule 1f1b --ranks 2 --microbatches 4 --vocab-parallel --vocab-costs 0.05,1,2,0.05)
expect_contains "$out" "vocabulary parallel: every rank runs its slices" "vocab header"
expect_contains "$out" "BCAST_X0 OF0 REDUCE_DX0 ALLGATHER_S0" "the output layer's slice between its collectives"
expect_contains "$out" "BCAST_DE0 EB0" "the root reads the embedding's gradient it broadcasts at once"
expect_contains "$out" "BCAST_DE3 EB3" "the embedding's backward"
pt schedule zbv --ranks 2 --stages 4 --microbatches 4 --vocab-parallel --svg "$tmp/zbv-vocab.svg" > /dev/null
expect_contains "$(cat "$tmp/zbv-vocab.svg")" ">OF3<" "vocabulary slices in the SVG timeline"
expect_failure "--vocab-costs \"1,2\": expected four numbers" \
  pt schedule 1f1b --ranks 2 --microbatches 4 --vocab-parallel --vocab-costs 1,2
expect_failure "--vocab-parallel: --csv --lowered cannot write the vocabulary slices yet" \
  pt schedule 1f1b --ranks 2 --microbatches 4 --vocab-parallel --csv "$tmp/v.csv" --lowered

# Errors: one line each.
expect_failure "unknown schedule 'nonesuch'" pt schedule nonesuch --ranks 2 --microbatches 4
printf '0F0,0B0\n1F0,2X0\n' > "$tmp/bad.csv"
expect_failure "bad.csv: rank 1, column 2: bad cell \"2X0\"" pt schedule --file "$tmp/bad.csv"
printf '0F0,0B0,0F1,0B1\n1F1,1B1,1F0,1B0\n' > "$tmp/deadlock.csv"
expect_failure "deadlock: rank 0 waits at 0B0" pt schedule --file "$tmp/deadlock.csv"
printf '0F0,0B0\n1F0\n' > "$tmp/missing.csv"
expect_failure "missing action 1B0" pt schedule --file "$tmp/missing.csv"
expect_failure "cannot open" pt schedule --file "$tmp/nonexistent.csv"
expect_failure "divisible by ranks" pt schedule interleaved-1f1b --ranks 4 --stages 8 --microbatches 6
expect_failure "not a multiple of --ranks" pt schedule 1f1b --ranks 4 --stages 6 --microbatches 8
expect_failure "--costs" pt schedule 1f1b --ranks 4 --microbatches 8 --costs 1,x,1

echo "schedule_cmd: all checks passed"
