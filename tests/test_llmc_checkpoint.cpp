// Tests for llm.c model files <-> pipetrain checkpoints: the parameter layout matches
// the model's, import keeps every value (fp32 and bf16), export is byte-identical to the
// imported fp32 file, and bad files fail with a message naming the file (and tensor).
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "pipetrain/core/config.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/io/checkpoint.hpp"
#include "pipetrain/io/llmc_checkpoint.hpp"
#include "pipetrain/model/stage.hpp"
#include "pipetrain/model/parameters.hpp"

namespace pipetrain {
namespace {

namespace fs = std::filesystem;

constexpr int kL = 2, kNH = 2, kC = 8, kV = 50, kVp = 128, kT = 16;

ModelConfig tiny_model() {
  ModelConfig m;
  m.n_layer = kL;
  m.n_head = kNH;
  m.d_model = kC;
  m.vocab_size = kV;
  m.max_seq_len = kT;
  return m;
}

// llm.c's parameter count for the tiny model, computed independently of llmc_layout.
constexpr int64_t kNumParams = int64_t{kVp} * kC + int64_t{kT} * kC +
                               kL * (2 * kC + 3 * kC * kC + 3 * kC + kC * kC + kC + 2 * kC + 4 * kC * kC + 4 * kC +
                                     4 * kC * kC + kC) +
                               2 * kC;

// A distinct, exactly representable value for every parameter index.
float pattern(int64_t i) { return static_cast<float>(i % 4093 - 2046) / 1024.0f + 1.0f / 65536.0f; }

uint16_t bf16_of(float f) { return static_cast<uint16_t>(std::bit_cast<uint32_t>(f) >> 16); }
float from_bf16(uint16_t h) { return std::bit_cast<float>(uint32_t{h} << 16); }

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class LlmcCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    dir_ = fs::temp_directory_path() / fmt::format("pipetrain_llmc_{}_{}", ::getpid(), counter++);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes an llm.c model file of the tiny model: header, then pattern(i) for every
  // parameter i (as fp32 for version 3, bf16 for version 5).
  std::string write_llmc(const std::string& name, int32_t version = 3, int32_t magic = 20240326,
                         int32_t vp = kVp) {
    std::vector<int32_t> header(256, 0);
    const int32_t fields[8] = {magic, version, kT, kV, kL, kNH, kC, vp};
    std::copy(std::begin(fields), std::end(fields), header.begin());
    std::ofstream out(path(name), std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()), 1024);
    for (int64_t i = 0; i < kNumParams; ++i) {
      if (version == 5) {
        const uint16_t h = bf16_of(pattern(i));
        out.write(reinterpret_cast<const char*>(&h), 2);
      } else {
        const float f = pattern(i);
        out.write(reinterpret_cast<const char*>(&f), 4);
      }
    }
    return path(name);
  }

  std::vector<float> read_tensor(const std::string& h5, const std::string& name, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    CheckpointTensor t;
    t.name = name;
    t.global_shape = std::move(shape);
    t.data = v.data();
    read_checkpoint_tensors(h5, MPI_COMM_SELF, {t});
    return v;
  }

  // Expects `fn` to throw a pipetrain::Error whose message holds every one of `needles`.
  template <typename Fn>
  void expect_error(Fn fn, const std::vector<std::string>& needles) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected one containing " << needles.front();
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
    }
  }

  fs::path dir_;
};

TEST_F(LlmcCheckpointTest, LayoutMatchesTheModelsParameters) {
  const ModelConfig m = tiny_model();
  ParameterStore store;
  ModelStage whole(m, 0, model_num_units(m), store);
  std::map<std::string, std::vector<int64_t>> model_params;
  for (const auto& p : store.params()) model_params[p.name] = p.global_shape;

  std::map<std::string, std::vector<int64_t>> layout;
  int64_t end = 0;
  for (const auto& t : llmc_layout(m)) {
    layout[t.name] = t.shape;
    int64_t n = 1;
    for (auto d : t.shape) n *= d;
    end = std::max(end, t.offset + n);
  }
  EXPECT_EQ(layout, model_params);
  EXPECT_EQ(llmc_num_params(m), kNumParams);
  EXPECT_EQ(end, kNumParams);
}

TEST_F(LlmcCheckpointTest, ImportKeepsEveryValueAndExportIsByteIdentical) {
  const std::string bin = write_llmc("model.bin");
  const std::string h5 = path("model.h5");
  const ModelConfig m = import_llmc(bin, h5);
  EXPECT_EQ(m.n_layer, kL);
  EXPECT_EQ(m.d_model, kC);
  EXPECT_FALSE(fs::exists(h5 + ".tmp"));

  // Metadata and the stored config.
  const CheckpointMeta meta = read_checkpoint_meta(h5);
  EXPECT_EQ(meta.step, 0);
  EXPECT_EQ(meta.tokens_seen, 0);
  EXPECT_EQ(meta.grid.ranks(), 1);
  const Config cfg = parse_config(meta.config_toml, h5);
  EXPECT_EQ(cfg.model.arch, "gpt2");
  EXPECT_EQ(cfg.model.n_layer, kL);
  EXPECT_EQ(cfg.model.n_head, kNH);
  EXPECT_EQ(cfg.model.d_model, kC);
  EXPECT_EQ(cfg.model.vocab_size, kV);
  EXPECT_EQ(cfg.model.max_seq_len, kT);

  // Params only, one dataset per parameter.
  const auto entries = list_checkpoint(h5);
  EXPECT_EQ(entries.size(), llmc_layout(m).size());
  for (const auto& e : entries) EXPECT_EQ(e.name.rfind("params/", 0), 0u) << e.name;
  EXPECT_TRUE(verify_checkpoint(h5).empty());

  // wte: the first Vp*C values, padded rows included.
  const auto wte = read_tensor(h5, "params/wte", {kVp, kC});
  for (int64_t i = 0; i < kVp * kC; ++i) ASSERT_EQ(wte[static_cast<size_t>(i)], pattern(i)) << i;
  // h.1.attn.qkv.w: after wte, wpe, ln1w, ln1b and layer 0's qkvw.
  const int64_t qkv1 = int64_t{kVp} * kC + kT * kC + 2 * kL * kC + 3 * kC * kC;
  const auto qkvw = read_tensor(h5, "params/h.1.attn.qkv.w", {3 * kC, kC});
  for (int64_t i = 0; i < 3 * kC * kC; ++i) ASSERT_EQ(qkvw[static_cast<size_t>(i)], pattern(qkv1 + i)) << i;
  // h.0.mlp.proj.b (fcprojb, layer 0) and lnf.b (the last C values).
  const int64_t fcprojb0 = kNumParams - 2 * kC - kL * kC;
  const auto pb = read_tensor(h5, "params/h.0.mlp.proj.b", {kC});
  const auto lnfb = read_tensor(h5, "params/lnf.b", {kC});
  for (int64_t i = 0; i < kC; ++i) {
    EXPECT_EQ(pb[static_cast<size_t>(i)], pattern(fcprojb0 + i));
    EXPECT_EQ(lnfb[static_cast<size_t>(i)], pattern(kNumParams - kC + i));
  }

  const std::string back = path("back.bin");
  export_llmc(h5, back);
  EXPECT_FALSE(fs::exists(back + ".tmp"));
  EXPECT_EQ(read_bytes(back), read_bytes(bin));
}

TEST_F(LlmcCheckpointTest, Bf16ImportWidensEveryValue) {
  const std::string h5 = path("bf16.h5");
  import_llmc(write_llmc("bf16.bin", 5), h5);
  const auto wte = read_tensor(h5, "params/wte", {kVp, kC});
  for (int64_t i = 0; i < kVp * kC; ++i) ASSERT_EQ(wte[static_cast<size_t>(i)], from_bf16(bf16_of(pattern(i)))) << i;
  const auto lnfw = read_tensor(h5, "params/lnf.w", {kC});
  for (int64_t i = 0; i < kC; ++i)
    EXPECT_EQ(lnfw[static_cast<size_t>(i)], from_bf16(bf16_of(pattern(kNumParams - 2 * kC + i))));

  // Exported as fp32 (version 3): the widened values.
  const std::string back = path("bf16_back.bin");
  export_llmc(h5, back);
  const auto bytes = read_bytes(back);
  ASSERT_EQ(bytes.size(), 1024u + 4u * static_cast<size_t>(kNumParams));
  int32_t version = 0;
  std::memcpy(&version, bytes.data() + 4, 4);
  EXPECT_EQ(version, 3);
  float last = 0;
  std::memcpy(&last, bytes.data() + bytes.size() - 4, 4);
  EXPECT_EQ(last, from_bf16(bf16_of(pattern(kNumParams - 1))));
}

TEST_F(LlmcCheckpointTest, BadFilesFailNamingTheFile) {
  const std::string out = path("x.h5");
  const std::string bad_magic = write_llmc("magic.bin", 3, 12345);
  expect_error([&] { import_llmc(bad_magic, out); }, {bad_magic, "bad magic"});
  const std::string v4 = write_llmc("v4.bin", 4);
  expect_error([&] { import_llmc(v4, out); }, {v4, "version 4 is not supported"});
  const std::string vp = write_llmc("vp.bin", 3, 20240326, 256);
  expect_error([&] { import_llmc(vp, out); }, {vp, "Vp = 256"});

  const std::string short_file = write_llmc("short.bin");
  fs::resize_file(short_file, fs::file_size(short_file) - 1);
  expect_error([&] { import_llmc(short_file, out); }, {short_file, "truncated"});
  const std::string header_only = write_llmc("header.bin");
  fs::resize_file(header_only, 100);
  expect_error([&] { import_llmc(header_only, out); }, {header_only, "truncated"});
  const std::string long_file = write_llmc("long.bin");
  fs::resize_file(long_file, fs::file_size(long_file) + 4);
  expect_error([&] { import_llmc(long_file, out); }, {long_file, "size mismatch"});
  expect_error([&] { import_llmc(path("missing.bin"), out); }, {path("missing.bin"), "no such file"});
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out + ".tmp"));

  // Export: not a checkpoint, and a checkpoint without one of the model's tensors.
  expect_error([&] { export_llmc(short_file, path("x.bin")); }, {short_file, "not an HDF5 file"});
  Config cfg;
  cfg.model = tiny_model();
  cfg.train.seq_len = kT;
  cfg.data.train = {"unset.h5"};
  CheckpointMeta meta;
  meta.config_toml = to_toml(cfg);
  std::vector<float> wte(static_cast<size_t>(kVp * kC), 0.5f);
  CheckpointTensor t;
  t.name = "params/wte";
  t.global_shape = {kVp, kC};
  t.data = wte.data();
  t.write = true;
  const std::string partial = path("partial.h5");
  write_checkpoint(partial, MPI_COMM_SELF, meta, {t});
  expect_error([&] { export_llmc(partial, path("x.bin")); }, {partial, "params/wpe"});
  EXPECT_FALSE(fs::exists(path("x.bin")));
  EXPECT_FALSE(fs::exists(path("x.bin.tmp")));
}

}  // namespace
}  // namespace pipetrain
