#!/usr/bin/env bash
# `pipetrain ckpt export-hf` / `import-hf`: a trained Llama checkpoint exports to a Hugging
# Face directory; importing it gives the same parameters bit for bit, and exporting that
# again gives byte-identical files; a run starts from the import (--init); a config.json
# the tensors do not match, an unsupported rope_scaling or a missing tensor is a one-line
# error naming the key or tensor. (That Hugging Face's own rotate-half convention gives the
# same loss on the export is checked against PyTorch in tests/cli/llama_reference.sh.)
# A mixture of experts exports as Mixtral (block_sparse_moe) and imports back; what Mixtral
# cannot say (shared experts, dense blocks) is refused by name.
set -euo pipefail
: "${PIPETRAIN:?}" "${SRC:?}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$SRC/tests/cli/lib/expect.sh"
cd "$tmp"
pt() { timeout 300 "$PIPETRAIN" "$@"; }
head -c 300000 "$SRC/inputs/austen.txt" >corpus.txt
pt data text corpus.txt -o corpus.h5 >/dev/null
small=(--set data.train=corpus.h5 --set model.n_layer=2 --set model.d_model=64 --set model.ffn_hidden=96
       --set train.seq_len=64 --set model.max_seq_len=64 --set log.progress=false)

echo "== a trained Llama checkpoint, exported, imported and exported again"
pt train "$SRC/inputs/llama-demo.toml" "${small[@]}" --set train.steps=2 --set checkpoint.dir=ck \
  --set checkpoint.every=2 >train.out
ck=ck/step_00000002.h5
pt ckpt export-hf "$ck" -o hfA | tee export.out
[[ -s hfA/model.safetensors && -s hfA/config.json ]] || die "export wrote no files"
pt ckpt import-hf hfA -o back.h5 | tee import.out
expect_contains "$(cat import.out)" "Llama 2 layers, 4 heads (2 key/value), d_model 64, MLP 96" "import summary"
h5diff "$ck" back.h5 /params /params || die "the imported parameters differ from the checkpoint's"
pt ckpt export-hf back.h5 -o hfB >/dev/null
cmp hfA/model.safetensors hfB/model.safetensors || die "export -> import -> export changed model.safetensors"
cmp hfA/config.json hfB/config.json || die "export -> import -> export changed config.json"
echo "   byte-identical; parameters bitwise equal"
python3 - hfA/config.json <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
assert c["model_type"] == "llama" and c["num_key_value_heads"] == 2 and c["tie_word_embeddings"] is False, c
assert c["rope_theta"] == 10000 and c["rope_scaling"] is None, c
PY

echo "== a run starts from the imported weights"
pt train "$SRC/inputs/llama-demo.toml" "${small[@]}" --set train.steps=1 --init back.h5 >init.out
grep -q "done: 1 steps" init.out || { cat init.out; die "training from the import failed"; }

echo "== bad directories are one-line errors naming the key or tensor"
edit() {  # DIR PYTHON-STATEMENT: copy hfA to DIR, then run the statement on config.json's dict c
  rm -rf "$1"
  cp -r hfA "$1"
  python3 - "$1/config.json" "$2" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
exec(sys.argv[2])
json.dump(c, open(sys.argv[1], "w"))
PY
}
edit scaled 'c["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0}'
check_failure rope_scaling one "config.json: rope_scaling" "not supported" -- "$PIPETRAIN" ckpt import-hf scaled -o x.h5
edit kv 'c["num_key_value_heads"] = 4'
check_failure kv_heads one "model.layers.0.self_attn.k_proj.weight has shape [32, 64]" "num_key_value_heads" \
  -- "$PIPETRAIN" ckpt import-hf kv -o x.h5
edit vocab 'c["vocab_size"] = 300'
check_failure vocab one "model.embed_tokens.weight" "vocab_size" -- "$PIPETRAIN" ckpt import-hf vocab -o x.h5
edit nokey 'del c["hidden_size"]'
check_failure missing_key one "config.json: missing key hidden_size" -- "$PIPETRAIN" ckpt import-hf nokey -o x.h5
rm -rf sharded
mkdir sharded
cp hfA/config.json sharded/
cp hfA/model.safetensors sharded/part-1.safetensors
python3 - hfA/model.safetensors sharded/model.safetensors.index.json <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
names = [k for k in json.loads(raw[8:8 + n]) if k != "__metadata__"]
names.remove("model.norm.weight")  # the index forgets one tensor
json.dump({"weight_map": {k: "part-1.safetensors" for k in names}}, open(sys.argv[2], "w"))
PY
check_failure missing_tensor one "missing tensor model.norm.weight" -- "$PIPETRAIN" ckpt import-hf sharded -o x.h5
pt train "$SRC/inputs/austen-char.toml" --set data.train=corpus.h5 --set model.n_layer=1 --set train.steps=1 \
  --set checkpoint.dir=g --set checkpoint.every=1 --set log.progress=false >/dev/null
check_failure gpt2_export one "model.arch = \"gpt2\": only Llama checkpoints export" \
  -- "$PIPETRAIN" ckpt export-hf g/step_00000001.h5 -o y

echo "== Mixtral: a trained mixture of experts exports as Mixtral, imports back bitwise; contradictions are errors"
mix=("${small[@]}" --set model.n_experts=4 --set model.top_k=2 --set model.expert_ffn_hidden=48 --set train.steps=1
     --set checkpoint.every=1)
pt train "$SRC/inputs/moe-demo.toml" "${mix[@]}" --set model.n_shared_experts=0 --set model.first_dense=0 \
  --set checkpoint.dir=mx >/dev/null
pt ckpt export-hf mx/step_00000001.h5 -o hfM >/dev/null
pt ckpt import-hf hfM -o mback.h5 >/dev/null
h5diff mx/step_00000001.h5 mback.h5 /params /params || die "the imported experts differ from the checkpoint's"
python3 - hfM/config.json <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
assert c["model_type"] == "mixtral" and c["num_local_experts"] == 4 and c["num_experts_per_tok"] == 2, c
assert c["intermediate_size"] == 48 and c["architectures"] == ["MixtralForCausalLM"], c
PY
rm -rf hfA
cp -r hfM hfA  # edit() copies hfA
edit experts 'c["num_local_experts"] = 8'
check_failure mixtral_experts one "block_sparse_moe.gate.weight has shape [4, 64]" "num_local_experts" \
  -- "$PIPETRAIN" ckpt import-hf experts -o x.h5
edit topk 'c["num_experts_per_tok"] = 5'
check_failure mixtral_top_k one "model.top_k (5) must be between 1 and model.n_experts (4)" \
  -- "$PIPETRAIN" ckpt import-hf topk -o x.h5
edit window 'c["sliding_window"] = 4096'
check_failure mixtral_window one "config.json: sliding_window 4096 is not supported" \
  -- "$PIPETRAIN" ckpt import-hf window -o x.h5
pt train "$SRC/inputs/moe-demo.toml" "${mix[@]}" --set checkpoint.dir=shared >/dev/null
check_failure mixtral_shared one "model.first_dense, moe_every: Mixtral has experts in every block" \
  -- "$PIPETRAIN" ckpt export-hf shared/step_00000001.h5 -o y
pt train "$SRC/inputs/moe-demo.toml" "${mix[@]}" --set model.n_shared_experts=0 --set model.first_dense=0 \
  --set model.router_force_balance=true --set checkpoint.dir=forced >/dev/null
check_failure mixtral_forced one "model.router_force_balance: Mixtral's router chooses by its scores" \
  -- "$PIPETRAIN" ckpt export-hf forced/step_00000001.h5 -o z
[ ! -e x.h5 ] || die "a failed import left x.h5 behind"
exit_with_failures
