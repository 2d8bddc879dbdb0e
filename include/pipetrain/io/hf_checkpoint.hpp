// Hugging Face Llama checkpoints <-> pipetrain checkpoints.
//
// A Hugging Face directory holds config.json (hidden_size, intermediate_size,
// num_attention_heads, num_hidden_layers, num_key_value_heads, rms_norm_eps, rope_theta,
// vocab_size, max_position_embeddings, tie_word_embeddings, rope_scaling) and
// model.safetensors, or shards listed in model.safetensors.index.json ("weight_map").
// Tensors: model.embed_tokens.weight, model.layers.<i>.{input_layernorm,
// post_attention_layernorm}.weight, .self_attn.{q,k,v,o}_proj.weight,
// .mlp.{gate,up,down}_proj.weight, model.norm.weight, lm_head.weight (untied only).
// Hugging Face orders each head's q and k rows for its rotate-half RoPE (the first half
// of the head's channels pair with the second half); pipetrain uses Meta's convention
// (consecutive pairs), so those rows are permuted on the way in and back on the way out.
// F32, F16 and BF16 tensors are read; exports are F32. The embedding and head gain
// pipetrain's zero padded rows on import and lose them on export, so an export followed
// by an import (and the reverse) is byte-identical.
#pragma once
#include <string>

#include "pipetrain/core/config.hpp"

namespace pipetrain {

// Reads the Hugging Face directory `dir` and writes its weights as a pipetrain checkpoint
// `out_h5` (params only, step 0; start a run from it with --init). Single process
// (MPI_COMM_SELF). Throws a one-line pipetrain::Error naming the file and the key or
// tensor: a missing or unsupported config key (rope_scaling included), a tensor missing
// or of a shape the config does not give. Returns the model read.
ModelConfig import_hf(const std::string& dir, const std::string& out_h5);

// Writes the params of the Llama checkpoint `h5` as a Hugging Face directory `out_dir`
// (config.json and model.safetensors, F32). Single process. Returns the model.
ModelConfig export_hf(const std::string& h5, const std::string& out_dir);

}  // namespace pipetrain
