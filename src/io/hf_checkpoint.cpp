// Hugging Face Llama checkpoints <-> pipetrain checkpoints (pipetrain/io/hf_checkpoint.hpp).
#include "pipetrain/io/hf_checkpoint.hpp"

#include <mpi.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "pipetrain/core/error.hpp"
#include "pipetrain/io/checkpoint.hpp"
#include "pipetrain/io/durable_file.hpp"
#include "pipetrain/io/h5io.hpp"
#include "pipetrain/io/safetensors.hpp"

namespace pipetrain {

namespace fs = std::filesystem;

namespace {

// One pipetrain tensor, its global shape, and where its values come from in HF's layout.
struct Mapping {
  std::string name;
  std::vector<int64_t> shape;
};

std::string layer(int l, const char* leaf) { return "h." + std::to_string(l) + "." + leaf; }
std::string hf_layer(int l, const std::string& leaf) { return "model.layers." + std::to_string(l) + "." + leaf; }
std::string hf_expert(int l, int e, const char* w) {
  return hf_layer(l, "block_sparse_moe.experts." + std::to_string(e) + "." + w + ".weight");
}

// HF rotate-half row order -> Meta's pairs, for `heads` heads of `hs` rows each (in place
// on a rows x cols block): Meta row 2i + j of a head is HF row j * hs/2 + i.
void hf_to_meta(float* rows, int heads, int hs, int64_t cols, bool inverse) {
  std::vector<float> head(static_cast<size_t>(hs * cols));
  for (int h = 0; h < heads; ++h) {
    float* p = rows + static_cast<int64_t>(h) * hs * cols;
    std::copy(p, p + hs * cols, head.begin());
    for (int i = 0; i < hs / 2; ++i)
      for (int j = 0; j < 2; ++j) {
        const int meta = 2 * i + j, hf = j * (hs / 2) + i;
        const int dst = inverse ? hf : meta, src = inverse ? meta : hf;
        std::copy(head.begin() + static_cast<int64_t>(src) * cols, head.begin() + static_cast<int64_t>(src + 1) * cols,
                  p + static_cast<int64_t>(dst) * cols);
      }
  }
}

template <class T>
T key(const nlohmann::json& c, const std::string& path, const char* k) {
  if (!c.contains(k)) fail("{}: missing key {}", path, k);
  try {
    return c.at(k).get<T>();
  } catch (const nlohmann::json::exception&) {
    fail("{}: key {} has the wrong type ({})", path, k, c.at(k).dump());
  }
}
template <class T>
T key_or(const nlohmann::json& c, const std::string& path, const char* k, T fallback) {
  if (!c.contains(k) || c.at(k).is_null()) return fallback;
  return key<T>(c, path, k);
}

// Mixtral: every block's MLP a mixture of num_local_experts experts of width
// intermediate_size, each token through num_experts_per_tok of them (softmax, renormalised).
void experts_from_hf(const nlohmann::json& c, const std::string& path, ModelConfig& m) {
  if (c.contains("sliding_window") && !c["sliding_window"].is_null())
    fail("{}: sliding_window {} is not supported (pipetrain's attention sees the whole context)", path,
         c["sliding_window"].dump());
  m.n_experts = key<int>(c, path, "num_local_experts");
  m.top_k = key<int>(c, path, "num_experts_per_tok");
  m.expert_ffn_hidden = m.ffn_hidden;
  m.aux_loss_coeff = key_or<double>(c, path, "router_aux_loss_coef", 0.001);  // MixtralConfig's default
  m.z_loss_coeff = 0;
  m.router = "softmax";
  m.router_renormalize = true;
}

// What a Mixtral config.json cannot say about a mixture of experts: a one-line refusal.
void check_mixtral_expressible(const ModelConfig& m, const std::string& path) {
  const auto refuse = [&](const char* key, const char* why) { fail("{}: {}: {}; no Mixtral export", path, key, why); };
  if (m.first_dense != 0 || m.moe_every != 1)
    refuse("model.first_dense, moe_every", "Mixtral has experts in every block");
  if (m.n_shared_experts > 0) refuse("model.n_shared_experts", "Mixtral has no shared experts");
  if (m.router != "softmax" || !m.router_renormalize)
    refuse("model.router, router_renormalize", "Mixtral's router is a softmax whose top k weights are renormalised");
  if (m.router_bias_rate > 0) refuse("model.router_bias_rate", "Mixtral's router has no selection bias");
  if (m.router_force_balance) refuse("model.router_force_balance", "Mixtral's router chooses by its scores");
}

ModelConfig model_from_hf(const nlohmann::json& c, const std::string& path) {
  const std::string type = c.contains("model_type") && c["model_type"].is_string() ? c["model_type"] : "llama";
  if (type != "llama" && type != "mixtral")
    fail("{}: model_type {} is not supported (expected \"llama\" or \"mixtral\")", path, c["model_type"].dump());
  if (c.contains("rope_scaling") && !c["rope_scaling"].is_null())
    fail("{}: rope_scaling {} is not supported (pipetrain's RoPE has no frequency scaling)", path,
         c["rope_scaling"].dump());
  ModelConfig m;
  m.arch = "llama";
  m.d_model = key<int>(c, path, "hidden_size");
  m.ffn_hidden = key<int>(c, path, "intermediate_size");
  m.n_head = key<int>(c, path, "num_attention_heads");
  m.n_layer = key<int>(c, path, "num_hidden_layers");
  m.n_kv_head = key_or<int>(c, path, "num_key_value_heads", m.n_head);
  m.norm_eps = key_or<double>(c, path, "rms_norm_eps", 1e-6);
  m.rope_theta = key_or<double>(c, path, "rope_theta", 10000.0);
  m.vocab_size = key<int>(c, path, "vocab_size");
  m.max_seq_len = key_or<int>(c, path, "max_position_embeddings", 2048);
  m.tie_embeddings = key_or<bool>(c, path, "tie_word_embeddings", false);
  if (m.n_head <= 0 || m.d_model % m.n_head != 0)
    fail("{}: hidden_size {} is not a multiple of num_attention_heads {}", path, m.d_model, m.n_head);
  if (c.contains("head_dim") && !c["head_dim"].is_null() && key<int>(c, path, "head_dim") != m.d_model / m.n_head)
    fail("{}: head_dim {} differs from hidden_size / num_attention_heads = {} (not supported)", path,
         key<int>(c, path, "head_dim"), m.d_model / m.n_head);
  if (m.n_kv_head <= 0 || m.n_head % m.n_kv_head != 0)
    fail("{}: num_key_value_heads {} does not divide num_attention_heads {}", path, m.n_kv_head, m.n_head);
  if (type == "mixtral") experts_from_hf(c, path, m);
  return m;
}

// The model's tensors through every shard of the directory.
class HfTensors {
 public:
  explicit HfTensors(const std::string& dir) : dir_(dir) {
    const std::string single = dir + "/model.safetensors", index = dir + "/model.safetensors.index.json";
    if (fs::exists(index)) {
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(std::ifstream(index));
      } catch (const nlohmann::json::exception& e) {
        fail("{}: not JSON: {}", index, e.what());
      }
      if (!j.contains("weight_map") || !j["weight_map"].is_object()) fail("{}: missing key weight_map", index);
      for (const auto& [name, file] : j["weight_map"].items()) where_[name] = file.get<std::string>();
    } else if (!fs::exists(single)) {
      fail("{}: neither model.safetensors nor model.safetensors.index.json", dir);
    }
  }
  // The tensor's values, checked against the shape the config gives.
  std::vector<float> get(const std::string& name, const std::vector<int64_t>& shape, const char* config_key) {
    SafetensorsFile& f = file_of(name);
    if (!f.has(name)) fail("{}: missing tensor {} (config.json: {})", dir_, name, config_key);
    if (f.shape(name) != shape)
      fail("{}: tensor {} has shape [{}], but config.json ({}) gives [{}]", dir_, name, join(f.shape(name)), config_key,
           join(shape));
    return f.read_f32(name);
  }
  bool has(const std::string& name) {
    if (!where_.empty() && !where_.count(name)) return false;
    return file_of(name).has(name);
  }

 private:
  static std::string join(const std::vector<int64_t>& s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out;
  }
  SafetensorsFile& file_of(const std::string& name) {
    std::string file = "model.safetensors";
    if (!where_.empty()) {
      const auto it = where_.find(name);
      if (it == where_.end()) fail("{}: missing tensor {} (not in model.safetensors.index.json)", dir_, name);
      file = it->second;
    }
    auto& f = files_[file];
    if (!f) f = std::make_unique<SafetensorsFile>(dir_ + "/" + file);
    return *f;
  }
  std::string dir_;
  std::map<std::string, std::string> where_;
  std::map<std::string, std::unique_ptr<SafetensorsFile>> files_;
};

// The pipetrain tensors of a Llama, in declaration order, with their global shapes.
std::vector<Mapping> llama_tensors(const ModelConfig& m) {
  const int64_t C = m.d_model, hs = C / m.n_head, Vp = m.padded_vocab(), F = m.ffn();
  std::vector<Mapping> out = {{"wte", {Vp, C}}};
  for (int l = 0; l < m.n_layer; ++l) {
    out.push_back({layer(l, "attn_norm.w"), {C}});
    out.push_back({layer(l, "attn.qkv.w"), {(m.n_head + 2 * m.kv_heads()) * hs, C}});
    out.push_back({layer(l, "attn.o.w"), {C, C}});
    out.push_back({layer(l, "mlp_norm.w"), {C}});
    if (m.moe(l)) {  // Mixtral's: every expert's rows stacked (moe_mlp.hpp)
      const int64_t E = m.n_experts, Fe = m.expert_ffn();
      out.push_back({layer(l, "moe.router.w"), {E, C}});
      out.push_back({layer(l, "moe.gate.w"), {E * Fe, C}});
      out.push_back({layer(l, "moe.up.w"), {E * Fe, C}});
      out.push_back({layer(l, "moe.down.w"), {E * C, Fe}});
      continue;
    }
    out.push_back({layer(l, "mlp.gate.w"), {F, C}});
    out.push_back({layer(l, "mlp.up.w"), {F, C}});
    out.push_back({layer(l, "mlp.down.w"), {C, F}});
  }
  out.push_back({"norm.w", {C}});
  if (!m.tied()) out.push_back({"lm_head.w", {Vp, C}});
  return out;
}

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

// Block l's MLP from Hugging Face: Llama's three projections, or Mixtral's router and experts
// (w1: gate, w3: up, w2: down), each expert's rows stacked in expert order.
void import_mlp(HfTensors& hf, const ModelConfig& m, int l, std::map<std::string, std::vector<float>>& values) {
  const int64_t C = m.d_model;
  if (!m.moe(l)) {
    const int64_t F = m.ffn();
    values[layer(l, "mlp.gate.w")] = hf.get(hf_layer(l, "mlp.gate_proj.weight"), {F, C}, "intermediate_size");
    values[layer(l, "mlp.up.w")] = hf.get(hf_layer(l, "mlp.up_proj.weight"), {F, C}, "intermediate_size");
    values[layer(l, "mlp.down.w")] = hf.get(hf_layer(l, "mlp.down_proj.weight"), {C, F}, "intermediate_size");
    return;
  }
  const int64_t F = m.expert_ffn();
  values[layer(l, "moe.router.w")] =
      hf.get(hf_layer(l, "block_sparse_moe.gate.weight"), {m.n_experts, C}, "num_local_experts, hidden_size");
  for (int e = 0; e < m.n_experts; ++e) {
    const auto append = [&](const char* leaf, const char* w, std::vector<int64_t> shape) {
      const std::vector<float> v = hf.get(hf_expert(l, e, w), shape, "num_local_experts, intermediate_size");
      auto& all = values[layer(l, leaf)];
      all.insert(all.end(), v.begin(), v.end());
    };
    append("moe.gate.w", "w1", {F, C});
    append("moe.up.w", "w3", {F, C});
    append("moe.down.w", "w2", {C, F});
  }
}

// Block l's MLP to Hugging Face (import_mlp's inverse); `add` takes (name, shape, values).
template <class Add>
void export_mlp(const ModelConfig& m, int l, const std::map<std::string, std::vector<float>>& values, Add&& add) {
  const int64_t C = m.d_model;
  if (!m.moe(l)) {
    const int64_t F = m.ffn();
    add(hf_layer(l, "mlp.gate_proj.weight"), {F, C}, values.at(layer(l, "mlp.gate.w")));
    add(hf_layer(l, "mlp.up_proj.weight"), {F, C}, values.at(layer(l, "mlp.up.w")));
    add(hf_layer(l, "mlp.down_proj.weight"), {C, F}, values.at(layer(l, "mlp.down.w")));
    return;
  }
  const int64_t F = m.expert_ffn(), block = F * C;  // one expert's matrix, either way round
  add(hf_layer(l, "block_sparse_moe.gate.weight"), {m.n_experts, C}, values.at(layer(l, "moe.router.w")));
  for (int e = 0; e < m.n_experts; ++e) {
    const auto part = [&](const char* leaf) {
      const auto& v = values.at(layer(l, leaf));
      return std::vector<float>(v.begin() + e * block, v.begin() + (e + 1) * block);
    };
    add(hf_expert(l, e, "w1"), {F, C}, part("moe.gate.w"));
    add(hf_expert(l, e, "w3"), {F, C}, part("moe.up.w"));
    add(hf_expert(l, e, "w2"), {C, F}, part("moe.down.w"));
  }
}

}  // namespace

ModelConfig import_hf(const std::string& dir, const std::string& out_h5) {
  h5io::Quiet quiet;
  const std::string cpath = dir + "/config.json";
  if (!fs::is_directory(dir)) fail("{}: not a directory", dir);
  if (!fs::exists(cpath)) fail("{}: missing config.json", dir);
  nlohmann::json cj;
  try {
    cj = nlohmann::json::parse(std::ifstream(cpath));
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not JSON: {}", cpath, e.what());
  }
  Config cfg;
  cfg.model = model_from_hf(cj, cpath);
  cfg.train.seq_len = std::min(cfg.train.seq_len, cfg.model.max_seq_len);
  cfg.data.train = {"unset.h5"};  // a placeholder: train with --init and its own data
  cfg.source = cpath;
  validate_config(cfg);
  cfg.source.clear();
  const ModelConfig& m = cfg.model;
  const int64_t C = m.d_model, hs = C / m.n_head, V = m.vocab_size;
  const int64_t Q = int64_t{m.n_head} * hs, KV = int64_t{m.kv_heads()} * hs;
  HfTensors hf(dir);
  std::map<std::string, std::vector<float>> values;
  auto padded = [&](const std::string& name) {  // (V, C) -> (Vp, C), zero rows appended
    std::vector<float> v = hf.get(name, {V, C}, "vocab_size, hidden_size");
    v.resize(static_cast<size_t>(m.padded_vocab() * C), 0.0f);
    return v;
  };
  values["wte"] = padded("model.embed_tokens.weight");
  for (int l = 0; l < m.n_layer; ++l) {
    values[layer(l, "attn_norm.w")] = hf.get(hf_layer(l, "input_layernorm.weight"), {C}, "hidden_size");
    std::vector<float> q = hf.get(hf_layer(l, "self_attn.q_proj.weight"), {Q, C}, "num_attention_heads");
    std::vector<float> k = hf.get(hf_layer(l, "self_attn.k_proj.weight"), {KV, C}, "num_key_value_heads");
    const std::vector<float> v = hf.get(hf_layer(l, "self_attn.v_proj.weight"), {KV, C}, "num_key_value_heads");
    hf_to_meta(q.data(), m.n_head, static_cast<int>(hs), C, false);
    hf_to_meta(k.data(), m.kv_heads(), static_cast<int>(hs), C, false);
    std::vector<float>& qkv = values[layer(l, "attn.qkv.w")];
    qkv.insert(qkv.end(), q.begin(), q.end());
    qkv.insert(qkv.end(), k.begin(), k.end());
    qkv.insert(qkv.end(), v.begin(), v.end());
    values[layer(l, "attn.o.w")] = hf.get(hf_layer(l, "self_attn.o_proj.weight"), {C, Q}, "hidden_size");
    values[layer(l, "mlp_norm.w")] = hf.get(hf_layer(l, "post_attention_layernorm.weight"), {C}, "hidden_size");
    import_mlp(hf, m, l, values);
  }
  values["norm.w"] = hf.get("model.norm.weight", {C}, "hidden_size");
  if (!m.tied()) values["lm_head.w"] = padded("lm_head.weight");

  CheckpointMeta meta;
  meta.seed = cfg.train.seed;
  meta.config_toml = to_toml(cfg);
  std::vector<CheckpointTensor> tensors;
  for (const auto& t : llama_tensors(m)) {
    CheckpointTensor ct;
    ct.name = "params/" + t.name;
    ct.global_shape = t.shape;
    ct.data = values.at(t.name).data();
    ct.write = true;
    tensors.push_back(std::move(ct));
  }
  write_checkpoint(out_h5, MPI_COMM_SELF, meta, tensors);
  return m;
}

ModelConfig export_hf(const std::string& h5, const std::string& out_dir) {
  h5io::Quiet quiet;
  const CheckpointMeta meta = read_checkpoint_meta(h5);
  const ModelConfig m = parse_config(meta.config_toml, h5).model;
  if (!m.family().hf_format) fail("{}: model.arch = \"{}\": only Llama checkpoints export to Hugging Face", h5, m.arch);
  if (m.n_experts > 0) check_mixtral_expressible(m, h5);
  std::map<std::string, std::vector<float>> values;
  std::vector<CheckpointTensor> tensors;
  const auto layout = llama_tensors(m);
  for (const auto& t : layout) values[t.name].resize(static_cast<size_t>(numel(t.shape)));
  for (const auto& t : layout) {
    CheckpointTensor ct;
    ct.name = "params/" + t.name;
    ct.global_shape = t.shape;
    ct.data = values[t.name].data();
    tensors.push_back(std::move(ct));
  }
  read_checkpoint_tensors(h5, MPI_COMM_SELF, tensors);
  const int64_t C = m.d_model, hs = C / m.n_head, V = m.vocab_size;
  const int64_t Q = int64_t{m.n_head} * hs, KV = int64_t{m.kv_heads()} * hs;
  std::map<std::string, std::vector<float>> hf;  // owned HF tensors
  std::vector<SafetensorsTensor> out;
  auto add = [&](std::string name, std::vector<int64_t> shape, std::vector<float> v) {
    auto& slot = hf[name];
    slot = std::move(v);
    out.push_back({std::move(name), std::move(shape), slot.data()});
  };
  auto rows = [&](const std::string& name, int64_t first, int64_t count) {
    const auto& v = values.at(name);
    return std::vector<float>(v.begin() + first * C, v.begin() + (first + count) * C);
  };
  add("model.embed_tokens.weight", {V, C}, rows("wte", 0, V));
  for (int l = 0; l < m.n_layer; ++l) {
    add(hf_layer(l, "input_layernorm.weight"), {C}, values.at(layer(l, "attn_norm.w")));
    std::vector<float> q = rows(layer(l, "attn.qkv.w"), 0, Q), k = rows(layer(l, "attn.qkv.w"), Q, KV);
    hf_to_meta(q.data(), m.n_head, static_cast<int>(hs), C, true);
    hf_to_meta(k.data(), m.kv_heads(), static_cast<int>(hs), C, true);
    add(hf_layer(l, "self_attn.q_proj.weight"), {Q, C}, std::move(q));
    add(hf_layer(l, "self_attn.k_proj.weight"), {KV, C}, std::move(k));
    add(hf_layer(l, "self_attn.v_proj.weight"), {KV, C}, rows(layer(l, "attn.qkv.w"), Q + KV, KV));
    add(hf_layer(l, "self_attn.o_proj.weight"), {C, Q}, values.at(layer(l, "attn.o.w")));
    add(hf_layer(l, "post_attention_layernorm.weight"), {C}, values.at(layer(l, "mlp_norm.w")));
    export_mlp(m, l, values, add);
  }
  add("model.norm.weight", {C}, values.at("norm.w"));
  if (!m.tied()) add("lm_head.weight", {V, C}, rows("lm_head.w", 0, V));

  fs::create_directories(out_dir);
  const bool mixtral = m.n_experts > 0;
  nlohmann::ordered_json c;
  c["architectures"] = {mixtral ? "MixtralForCausalLM" : "LlamaForCausalLM"};
  c["model_type"] = mixtral ? "mixtral" : "llama";
  c["hidden_size"] = m.d_model;
  c["intermediate_size"] = mixtral ? m.expert_ffn() : m.ffn();
  if (mixtral) {
    c["num_local_experts"] = m.n_experts;
    c["num_experts_per_tok"] = m.top_k;
    c["router_aux_loss_coef"] = m.aux_loss_coeff;
    c["output_router_logits"] = false;
    c["sliding_window"] = nullptr;
  }
  c["num_attention_heads"] = m.n_head;
  c["num_hidden_layers"] = m.n_layer;
  c["num_key_value_heads"] = m.kv_heads();
  c["rms_norm_eps"] = m.norm_eps;
  c["rope_theta"] = m.rope_theta;
  c["rope_scaling"] = nullptr;
  c["vocab_size"] = m.vocab_size;
  c["max_position_embeddings"] = m.max_seq_len;
  c["tie_word_embeddings"] = m.tied();
  c["hidden_act"] = "silu";
  c["torch_dtype"] = "float32";
  write_durably(out_dir + "/config.json", [&](std::ostream& out) { out << c.dump(2) << "\n"; });
  write_safetensors(out_dir + "/model.safetensors", out, {{"format", "pt"}});
  return m;
}

}  // namespace pipetrain
