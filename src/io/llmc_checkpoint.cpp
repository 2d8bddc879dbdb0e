// llm.c GPT-2 model files <-> pipetrain checkpoints (see pipetrain/io/llmc_checkpoint.hpp).
#include "pipetrain/io/llmc_checkpoint.hpp"

#include <mpi.h>

#include <algorithm>
#include <array>
#include <bit>
#include <filesystem>
#include <fstream>

#include "pipetrain/core/error.hpp"
#include "pipetrain/io/checkpoint.hpp"
#include "pipetrain/io/durable_file.hpp"
#include "pipetrain/io/h5io.hpp"

namespace pipetrain {

static_assert(std::endian::native == std::endian::little, "llm.c files are little-endian");

namespace fs = std::filesystem;

namespace {

using Header = std::array<int32_t, kLlmcHeaderInts>;
constexpr int64_t kHeaderBytes = kLlmcHeaderInts * 4;

// One llm.c parameter kind: its per-layer shape (all layers stored together).
struct Kind {
  const char* leaf;  // pipetrain name: "h.<l>.<leaf>", or the whole name when not per layer
  bool per_layer;
  std::vector<int64_t> shape;
};

// llm.c's parameter kinds, in file order.
std::vector<Kind> llmc_kinds(const ModelConfig& m) {
  const int64_t C = m.d_model, Vp = m.padded_vocab(), T = m.max_seq_len;
  return {{"wte", false, {Vp, C}},           {"wpe", false, {T, C}},
          {"ln1.w", true, {C}},              {"ln1.b", true, {C}},
          {"attn.qkv.w", true, {3 * C, C}},  {"attn.qkv.b", true, {3 * C}},
          {"attn.proj.w", true, {C, C}},     {"attn.proj.b", true, {C}},
          {"ln2.w", true, {C}},              {"ln2.b", true, {C}},
          {"mlp.fc.w", true, {4 * C, C}},    {"mlp.fc.b", true, {4 * C}},
          {"mlp.proj.w", true, {C, 4 * C}},  {"mlp.proj.b", true, {C}},
          {"lnf.w", false, {C}},             {"lnf.b", false, {C}}};
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::string layer_name(int layer, const char* leaf) { return "h." + std::to_string(layer) + "." + leaf; }

// The config of an imported checkpoint: the model an llm.c header describes (checked;
// the file is named in every message), the rest defaults.
Config config_from_header(const Header& h, const std::string& bin) {
  if (h[0] != kLlmcModelMagic)
    fail("{}: bad magic {} (expected {}): not an llm.c GPT-2 model file", bin, h[0], kLlmcModelMagic);
  if (h[1] != kLlmcVersionFp32 && h[1] != kLlmcVersionBf16)
    fail("{}: llm.c model version {} is not supported (expected {} = fp32 or {} = bf16)", bin, h[1],
         kLlmcVersionFp32, kLlmcVersionBf16);
  // Bounds far above any GPT-2, low enough that no size computation can overflow.
  const std::array<std::pair<const char*, int32_t>, 6> limits{
      {{"maxT", 1 << 28}, {"V", 1 << 28}, {"L", 1 << 16}, {"NH", 1 << 16}, {"C", 1 << 16}, {"Vp", 1 << 28}}};
  for (size_t i = 0; i < limits.size(); ++i) {
    const int32_t v = h[i + 2];
    if (v <= 0 || v > limits[i].second)
      fail("{}: bad llm.c header: {} = {} (expected 1..{})", bin, limits[i].first, v, limits[i].second);
  }
  Config cfg;
  cfg.source = bin;
  cfg.model.arch = "gpt2";
  cfg.model.max_seq_len = h[2];
  cfg.model.vocab_size = h[3];
  cfg.model.n_layer = h[4];
  cfg.model.n_head = h[5];
  cfg.model.d_model = h[6];
  if (h[7] != cfg.model.padded_vocab())
    fail("{}: padded vocabulary Vp = {} for V = {} is not {} (V rounded up to a multiple of 128, as "
         "pipetrain pads it)",
         bin, h[7], h[3], cfg.model.padded_vocab());
  cfg.train.seq_len = std::min(cfg.train.seq_len, cfg.model.max_seq_len);
  cfg.data.train = {"unset.h5"};  // a placeholder: train with --init and its own data
  validate_config(cfg);
  cfg.source.clear();
  return cfg;
}

void read_exact(std::ifstream& in, void* dst, int64_t bytes, const std::string& bin) {
  in.read(static_cast<char*>(dst), static_cast<std::streamsize>(bytes));
  if (!in || in.gcount() != static_cast<std::streamsize>(bytes)) fail("{}: read error", bin);
}

// Reads the whole llm.c parameter array as fp32.
std::vector<float> read_llmc(const std::string& bin, Config& cfg) {
  std::error_code ec;
  if (!fs::exists(bin, ec)) fail("{}: no such file", bin);
  if (fs::is_directory(bin, ec)) fail("{}: is a directory, not an llm.c model file", bin);
  const auto size = static_cast<int64_t>(fs::file_size(bin, ec));
  if (ec) fail("{}: cannot read: {}", bin, ec.message());
  std::ifstream in(bin, std::ios::binary);
  if (!in) fail("{}: cannot open", bin);
  if (size < kHeaderBytes)
    fail("{}: truncated llm.c model file: {} bytes, shorter than the {}-byte header", bin, size, kHeaderBytes);
  Header h{};
  read_exact(in, h.data(), kHeaderBytes, bin);
  cfg = config_from_header(h, bin);
  const int64_t n = llmc_num_params(cfg.model);
  const int64_t esize = h[1] == kLlmcVersionFp32 ? 4 : 2;
  const int64_t expected = kHeaderBytes + n * esize;
  if (size < expected)
    fail("{}: truncated llm.c model file: {} bytes, expected {} for the model in its header", bin, size,
         expected);
  if (size > expected)
    fail("{}: size mismatch: {} bytes, expected {} for the model in its header (trailing data)", bin, size,
         expected);
  std::vector<float> values(static_cast<size_t>(n));
  if (esize == 4) {
    read_exact(in, values.data(), n * 4, bin);
  } else {  // bf16: the upper half of an fp32
    std::vector<uint16_t> half(static_cast<size_t>(n));
    read_exact(in, half.data(), n * 2, bin);
    for (size_t i = 0; i < half.size(); ++i) values[i] = std::bit_cast<float>(uint32_t{half[i]} << 16);
  }
  return values;
}

}  // namespace

std::vector<LlmcTensor> llmc_layout(const ModelConfig& model) {
  const auto kinds = llmc_kinds(model);
  std::vector<int64_t> base(kinds.size());  // first element of each kind in the file
  int64_t at = 0;
  for (size_t k = 0; k < kinds.size(); ++k) {
    base[k] = at;
    at += numel(kinds[k].shape) * (kinds[k].per_layer ? model.n_layer : 1);
  }
  std::vector<LlmcTensor> out;
  auto add = [&](size_t k, int layer) {
    const Kind& kind = kinds[k];
    out.push_back({kind.per_layer ? layer_name(layer, kind.leaf) : std::string(kind.leaf), kind.shape,
                   base[k] + (kind.per_layer ? layer * numel(kind.shape) : 0)});
  };
  add(0, 0);  // wte
  add(1, 0);  // wpe
  for (int l = 0; l < model.n_layer; ++l)
    for (size_t k = 2; k + 2 < kinds.size(); ++k) add(k, l);
  add(kinds.size() - 2, 0);  // lnf.w
  add(kinds.size() - 1, 0);  // lnf.b
  return out;
}

int64_t llmc_num_params(const ModelConfig& model) {
  int64_t n = 0;
  for (const auto& k : llmc_kinds(model)) n += numel(k.shape) * (k.per_layer ? model.n_layer : 1);
  return n;
}

ModelConfig import_llmc(const std::string& bin, const std::string& out_h5) {
  h5io::Quiet quiet;
  Config cfg;
  std::vector<float> values = read_llmc(bin, cfg);
  const ModelConfig& model = cfg.model;

  CheckpointMeta meta;
  meta.seed = cfg.train.seed;
  meta.config_toml = to_toml(cfg);
  meta.schedule = "";  // never trained here
  std::vector<CheckpointTensor> tensors;
  for (const auto& t : llmc_layout(model)) {
    CheckpointTensor ct;
    ct.name = "params/" + t.name;
    ct.global_shape = t.shape;
    ct.data = values.data() + t.offset;
    ct.write = true;
    tensors.push_back(std::move(ct));
  }
  write_checkpoint(out_h5, MPI_COMM_SELF, meta, tensors);
  return model;
}

ModelConfig export_llmc(const std::string& h5, const std::string& out_bin) {
  h5io::Quiet quiet;
  const CheckpointMeta meta = read_checkpoint_meta(h5);
  const ModelConfig model = parse_config(meta.config_toml, h5).model;
  std::vector<float> values(static_cast<size_t>(llmc_num_params(model)));
  std::vector<CheckpointTensor> tensors;
  for (const auto& t : llmc_layout(model)) {
    CheckpointTensor ct;
    ct.name = "params/" + t.name;
    ct.global_shape = t.shape;
    ct.data = values.data() + t.offset;
    tensors.push_back(std::move(ct));
  }
  read_checkpoint_tensors(h5, MPI_COMM_SELF, tensors);

  Header h{};
  h[0] = kLlmcModelMagic;
  h[1] = kLlmcVersionFp32;
  h[2] = model.max_seq_len;
  h[3] = model.vocab_size;
  h[4] = model.n_layer;
  h[5] = model.n_head;
  h[6] = model.d_model;
  h[7] = model.padded_vocab();
  write_durably(out_bin, [&](std::ostream& out) {
    out.write(reinterpret_cast<const char*>(h.data()), static_cast<std::streamsize>(kHeaderBytes));
    out.write(reinterpret_cast<const char*>(values.data()),
              static_cast<std::streamsize>(values.size() * sizeof(float)));
  });
  return model;
}

}  // namespace pipetrain
