// Model families by registry: what each family of models is, in one table. The layers,
// the cost model, the grid and config rules, the run header and import/export ask a
// family for its traits; nothing else compares model.arch. Adding a family is one entry
// here, its block layers (model/) and, where its traits differ from both, the places that
// read the trait.
#pragma once
#include <string>
#include <string_view>

namespace pipetrain {

// The transformer block a family stacks.
enum class BlockKind {
  Gpt2,   // pre-LayerNorm, multi-head attention, a GELU MLP of 4 d_model
  Llama,  // pre-RMSNorm, rotary grouped-query attention, a SwiGLU MLP (or a mixture of experts)
};

struct ModelFamily {
  std::string_view arch;  // model.arch
  std::string_view name;  // for people: "GPT-2", "Llama"
  BlockKind blocks;
  bool learned_positions;  // a table of positions (wpe) beside the tokens'; false: rotary
  bool rms_norm;           // RMSNorm without bias; false: LayerNorm with bias
  bool grouped_kv;         // model.n_kv_head key/value heads, rotary keys: Llama's model.* keys
  bool gated_mlp;          // three matrices of model.ffn_hidden; false: two of 4 d_model
  bool always_tied;        // the output layer is the token table (else model.tie_embeddings)
  bool experts;            // model.n_experts may replace its MLPs
  bool hf_format;          // imports from and exports to Hugging Face's format
};

// The family of model.arch = `arch`, or null when there is none.
const ModelFamily* find_model_family(std::string_view arch);
// The same, throwing pipetrain::Error ("model.arch: unsupported architecture ...").
const ModelFamily& model_family(std::string_view arch);
// "\"gpt2\" or \"llama\"": every family's model.arch, for messages.
std::string model_family_names();

}  // namespace pipetrain
