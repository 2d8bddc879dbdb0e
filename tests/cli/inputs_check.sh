#!/usr/bin/env bash
# Every bundled config inputs/*.toml validates for its full grid, and every sample schedule
# inputs/schedules/*.csv validates:
#   1. `pipetrain check` on one process, whatever dp * pp * cp * tp: config, grid, the lowered
#      program of every rank, the memory estimate on the cluster its runtime.device runs
#      on (inputs/clusters/cpu-node.toml for the CPU, dgx-h100.toml for CUDA); the data
#      files are not here (--no-data).
#   2. model, schedule and trainer build (`--set train.steps=0`, with a real token file, a
#      slice of inputs/austen.txt) for CPU configs of at most 4 ranks whose weights,
#      gradients and AdamW state (16 bytes per parameter) fit INPUTS_CHECK_MAX_MB (default
#      2500): the grids that need more ranks are the checks' (step 1) and the MPI suites'.
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

# Reads what the check needs with Python's TOML parser (a second, independent parser):
# ranks, seq_len, the minimum number of blocks, and the parameter count.
describe() {  # CONFIG -> "ranks seq_len min_layers params params_at_min_layers layers_per_stage_set device"
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
        # Mixture-of-experts blocks: the router and every routed and shared expert.
        E, first, every = m.get("n_experts", 0), m.get("first_dense", 0), m.get("moe_every", 1)
        Fe = m.get("expert_ffn_hidden", 0) or F
        moe = C * (C + 2 * NKV * (C // NH)) + C * C + C * E + 3 * C * Fe * (E + m.get("n_shared_experts", 0)) + 2 * C
        n_moe = sum(1 for b in range(L) if E and b >= first and (b - first) % every == 0)
        return Vp * C * (1 if m.get("tie_embeddings", False) else 2) + (L - n_moe) * block + n_moe * moe + C
    return Vp * C + S * C + L * (12 * C * C + 13 * C) + 2 * C
pp, vs = p.get("pp", 1), p.get("virtual_stages", 1)
stages = pp * vs
# One block per stage always splits validly.
min_layers = stages
print(p.get("dp", 1) * pp * p.get("cp", 1) * p.get("tp", 1), t.get("seq_len", 256), min_layers, params(L), params(min_layers),
      1 if p.get("layers_per_stage") else 0, c.get("runtime", {}).get("device", "cpu"))
PY
}

mapfile -t configs < <(find "$SRC/inputs" -maxdepth 1 -name '*.toml' | sort)
[ ${#configs[@]} -ge 4 ] || die "expected at least 4 configs in $SRC/inputs, found ${#configs[@]}"
for cfg in "${configs[@]}"; do
  name=$(basename "$cfg" .toml)
  read -r ranks seq_len _ params _ _ device < <(describe "$cfg") || die "$cfg: not valid TOML"
  state_mb=$((params * 16 / 1048576))
  echo "== $name: $ranks ranks, ~$params parameters (~$state_mb MB of state), seq_len $seq_len, $device"

  # 1. Full config and grid on one process.
  cluster=$SRC/inputs/clusters/cpu-node.toml
  if [ "$device" = cuda ]; then cluster=$SRC/inputs/clusters/dgx-h100.toml; fi
  timeout 300 "$PIPETRAIN" check "$cfg" --no-data --cluster "$cluster" >"$name.1.out" 2>&1 ||
    { cat "$name.1.out"; die "$name: pipetrain check refused it"; }
  grep -q "^check: ok: $cfg on $ranks ranks" "$name.1.out" || { cat "$name.1.out"; die "$name: no 'check: ok' line"; }
  echo "   $(tail -n 1 "$name.1.out")"

  # 2. Build the model (steps = 0) where the grid is small and the state fits.
  if [ "$device" != cpu ] || [ "$ranks" -gt 4 ] || [ "$state_mb" -gt "$MAX_MB" ]; then continue; fi
  run=(timeout 600 "$MPIEXEC" -np "$ranks" "$PIPETRAIN" train "$cfg" --set log.every=1
       --set "checkpoint.dir=$tmp/ckpt-$name")
  "${run[@]}" --set data.train=corpus.h5 --set train.steps=0 >"$name.2.out" 2>&1 ||
    { cat "$name.2.out"; die "$name: train.steps=0 failed"; }
  grep -q "done: 0 steps" "$name.2.out" || { cat "$name.2.out"; die "$name: no 'done: 0 steps'"; }
  echo "   model, schedule and trainer build: $(grep -Eo '(GPT-2|Llama) .* parameters' "$name.2.out")"

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
