#!/usr/bin/env bash
# Every bundled config inputs/*.toml parses and validates, and every sample schedule
# inputs/schedules/*.csv validates. There is no `pipetrain config check`, so each config
# goes through `pipetrain train` on its own number of ranks (dp * pp * tp):
#   1. config and grid, at its full size: with a 2-token data file the run must fail
#      with exactly the data error ("need at least seq_len+1"), which pipetrain only
#      reaches after the whole config has been validated and the grid built (a config
#      error would be reported instead). Costs no memory.
#   2. model, schedule and trainer build: `--set train.steps=0` with a real token file
#      (a slice of inputs/austen.txt) must exit 0. Configs whose weights, gradients and
#      AdamW state (16 bytes per parameter) exceed INPUTS_CHECK_MAX_MB (default 2500)
#      are built with model.n_layer reduced to one block per stage instead (gpt2-350m:
#      5.7 GB at full size), so the test stays light; step 1 covered the full size.
#   3. configs with under 64 MB of state (the demos) also train 2 steps.
# Schedules: `pipetrain schedule --file F` with --placement v for V-shaped files
# (zbv-*, dualpipev-*), loop otherwise.
# Env: PIPETRAIN = the executable; SRC = the source tree; MPIEXEC = mpiexec.
set -euo pipefail
: "${PIPETRAIN:?set PIPETRAIN to the pipetrain executable}"
SRC=${SRC:-$(cd "$(dirname "$0")/../.." && pwd)}
MPIEXEC=${MPIEXEC:-mpiexec}
MAX_MB=${INPUTS_CHECK_MAX_MB:-2500}
export OMPI_MCA_rmaps_base_oversubscribe=${OMPI_MCA_rmaps_base_oversubscribe:-1}
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
die() { echo "FAIL: $*" >&2; exit 1; }
cd "$tmp"

head -c 200000 "$SRC/inputs/austen.txt" >corpus.txt
timeout 120 "$PIPETRAIN" data text corpus.txt -o corpus.h5 >/dev/null
printf 'ab' >two.txt
timeout 120 "$PIPETRAIN" data text two.txt -o two.h5 >/dev/null

# Reads what the check needs with Python's TOML parser (a second, independent parser):
# ranks, seq_len, the minimum number of blocks, and the parameter count.
describe() {  # CONFIG -> "ranks seq_len min_layers params params_at_min_layers layers_per_stage_set"
  python3 - "$1" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    c = tomllib.load(f)
m, p, t = c.get("model", {}), c.get("parallel", {}), c.get("train", {})
L, C = m.get("n_layer", 12), m.get("d_model", 768)
V, S = m.get("vocab_size", 50257), m.get("max_seq_len", 1024)
Vp = (V + 127) // 128 * 128
def params(L):
    if m.get("arch", "gpt2") == "llama":
        NH = m.get("n_head", 12)
        NKV = m.get("n_kv_head", 0) or NH
        F = m.get("ffn_hidden", 0)
        if not F:
            mult = m.get("multiple_of", 256)
            F = (2 * 4 * C // 3 + mult - 1) // mult * mult
        block = C * (C + 2 * NKV * (C // NH)) + C * C + 3 * C * F + 2 * C
        return Vp * C * (1 if m.get("tie_embeddings", False) else 2) + L * block + C
    return Vp * C + S * C + L * (12 * C * C + 13 * C) + 2 * C
pp, vs = p.get("pp", 1), p.get("virtual_stages", 1)
stages = pp * vs
# One block per stage always splits validly.
min_layers = stages
print(p.get("dp", 1) * pp * p.get("tp", 1), t.get("seq_len", 256), min_layers, params(L), params(min_layers),
      1 if p.get("layers_per_stage") else 0)
PY
}

mapfile -t configs < <(find "$SRC/inputs" -maxdepth 1 -name '*.toml' | sort)
[ ${#configs[@]} -ge 4 ] || die "expected at least 4 configs in $SRC/inputs, found ${#configs[@]}"
for cfg in "${configs[@]}"; do
  name=$(basename "$cfg" .toml)
  read -r ranks seq_len min_layers params min_params fixed_layers < <(describe "$cfg") || die "$cfg: not valid TOML"
  state_mb=$((params * 16 / 1048576))
  min_state_mb=$((min_params * 16 / 1048576))
  echo "== $name: $ranks ranks, ~$params parameters (~$state_mb MB of state), seq_len $seq_len"
  run=(timeout 600 "$MPIEXEC" -np "$ranks" "$PIPETRAIN" train "$cfg" --set log.every=1
       --set "checkpoint.dir=$tmp/ckpt-$name")

  # 1. Full config and grid: only the data can be wrong.
  if "${run[@]}" --set data.train=two.h5 --set train.steps=0 >"$name.1.out" 2>&1; then
    die "$name: a 2-token data file was accepted"
  fi
  grep -q "two.h5: 2 tokens, need at least seq_len+1 = $((seq_len + 1))" "$name.1.out" ||
    { cat "$name.1.out"; die "$name: the config or grid is refused (expected only the data error)"; }
  echo "   config and $ranks-rank grid validate"

  # 2. Build the model (steps = 0), on the CPU (GPU configs are built the same way).
  run+=(--set runtime.device=cpu)
  shrink=()
  if [ "$state_mb" -gt "$MAX_MB" ]; then
    [ "$fixed_layers" -eq 0 ] || { echo "   skipped the build: layers_per_stage is fixed and the model is large"; continue; }
    [ "$min_state_mb" -le "$MAX_MB" ] ||
      { echo "   skipped the build: even one block per stage holds ~$min_state_mb MB of state (the embeddings)"; continue; }
    shrink=(--set "model.n_layer=$min_layers")
  fi
  "${run[@]}" --set data.train=corpus.h5 --set train.steps=0 "${shrink[@]}" >"$name.2.out" 2>&1 ||
    { cat "$name.2.out"; die "$name: train.steps=0 failed"; }
  grep -q "done: 0 steps" "$name.2.out" || { cat "$name.2.out"; die "$name: no 'done: 0 steps'"; }
  echo "   model, schedule and trainer build${shrink[*]:+ (with ${shrink[*]})}: $(grep -Eo '(GPT-2|Llama) .* parameters' "$name.2.out")"

  # 3. Small configs train two steps.
  if [ "$state_mb" -lt 64 ]; then
    "${run[@]}" --set data.train=corpus.h5 --set train.steps=2 --metrics "$name.jsonl" >"$name.3.out" 2>&1 ||
      { cat "$name.3.out"; die "$name: 2 training steps failed"; }
    [ "$(grep -c '"loss"' "$name.jsonl")" -eq 2 ] || { cat "$name.3.out"; die "$name: expected 2 metrics rows"; }
    echo "   trains: $(grep -o 'schedule [^:]*: [0-9]* stages' "$name.3.out"), 2 steps"
  fi
done

echo "== sample schedules"
mapfile -t schedules < <(find "$SRC/inputs/schedules" -name '*.csv' | sort)
[ ${#schedules[@]} -ge 1 ] || die "no schedules in $SRC/inputs/schedules"
for f in "${schedules[@]}"; do
  case $(basename "$f") in
    zbv* | dualpipev*) placement=v ;;
    *) placement=loop ;;
  esac
  out=$(timeout 60 "$PIPETRAIN" schedule --file "$f" --placement "$placement" --json 2>&1) ||
    die "$f (--placement $placement): $out"
  grep -q '"bubble_fraction"' <<<"$out" || die "$f: unexpected output: $out"
  echo "   $(basename "$f") (placement $placement): $out"
done
echo "all inputs validate"
