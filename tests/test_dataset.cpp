// Tests for the HDF5 token datasets: writing and reading token files, window
// arithmetic, sequential and shuffled sampling, llm.c/text/raw conversion, and every
// error a user can hit (each message must name the file).
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "pipetrain/core/error.hpp"
#include "pipetrain/io/data_convert.hpp"
#include "pipetrain/io/batch_sampler.hpp"
#include "pipetrain/io/token_dataset.hpp"

namespace pipetrain {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed afterwards.
class DatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    dir_ =
        fs::temp_directory_path() / fmt::format("pipetrain_dataset_{}_{}", ::getpid(), counter++);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    open_ids_ = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL);
  }
  void TearDown() override {
    // Every HDF5 id we opened is closed again (RAII), also on error paths.
    EXPECT_EQ(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL), open_ids_);
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes tokens 0,1,2,... (mod vocab) starting at `start`.
  std::string make_file(const std::string& name, int64_t n, int64_t vocab = 256,
                        uint32_t start = 0) {
    std::vector<uint32_t> t(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = (start + i) % vocab;
    write_token_file(path(name), t, vocab, "byte");
    return path(name);
  }

  void write_bytes(const std::string& p, const std::vector<unsigned char>& bytes) {
    std::ofstream f(p, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  }

  // A synthetic llm.c shard: 256 int32 header then uint16 tokens, little-endian.
  std::string make_shard(const std::string& name, const std::vector<uint16_t>& tokens,
                         int32_t magic = kLlmcMagic, int32_t version = kLlmcVersion,
                         int32_t count = -1, size_t drop_bytes = 0) {
    std::vector<unsigned char> b(1024, 0);
    auto put32 = [&](size_t at, int32_t v) {
      for (int k = 0; k < 4; ++k)
        b[at + k] = static_cast<unsigned char>((uint32_t(v) >> (8 * k)) & 0xff);
    };
    put32(0, magic);
    put32(4, version);
    put32(8, count < 0 ? static_cast<int32_t>(tokens.size()) : count);
    for (uint16_t t : tokens) {
      b.push_back(static_cast<unsigned char>(t & 0xff));
      b.push_back(static_cast<unsigned char>(t >> 8));
    }
    b.resize(b.size() - drop_bytes);
    write_bytes(path(name), b);
    return path(name);
  }

  fs::path dir_;
  ssize_t open_ids_ = 0;
};

// Runs `f`, expects pipetrain::Error whose message contains every one of `parts`.
template <typename F>
void expect_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no pipetrain::Error thrown";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg << " lacks " << p;
  }
}

// Writes an HDF5 file with a dataset `name` of the given type and dims (zeros).
void write_h5(const std::string& p, const char* name, hid_t type, std::vector<hsize_t> dims) {
  hid_t f = H5Fcreate(p.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  hid_t s = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  hid_t d = H5Dcreate2(f, name, type, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dclose(d);
  H5Sclose(s);
  H5Fclose(f);
}

TEST_F(DatasetTest, RoundTripUint16) {
  std::vector<uint32_t> t = {0, 1, 255, 65535, 7, 42, 65534};
  auto info = write_token_file(path("a.h5"), t, 65536, "custom");
  EXPECT_EQ(info.dtype, "uint16");
  EXPECT_FALSE(fs::exists(path("a.h5.tmp")));
  auto got = inspect_token_file(path("a.h5"));
  EXPECT_EQ(got.num_tokens, 7);
  EXPECT_EQ(got.vocab_size, 65536);
  EXPECT_EQ(got.tokenizer, "custom");
  EXPECT_EQ(got.dtype, "uint16");
  TokenDataset ds({path("a.h5")}, 6, 65536);
  std::vector<int32_t> out(7);
  ds.read_window(0, out.data());
  for (size_t i = 0; i < t.size(); ++i) EXPECT_EQ(out[i], static_cast<int32_t>(t[i]));
  EXPECT_EQ(ds.vocab_size(), 65536);
  EXPECT_EQ(ds.tokenizer(), "custom");
}

TEST_F(DatasetTest, RoundTripUint32) {
  std::vector<uint32_t> t = {0, 65536, 100000, 128255, 3};
  auto info = write_token_file(path("b.h5"), t, 128256, "llama3");
  EXPECT_EQ(info.dtype, "uint32");
  EXPECT_EQ(inspect_token_file(path("b.h5")).dtype, "uint32");
  TokenDataset ds({path("b.h5")}, 4, 128256);
  std::vector<int32_t> out(5);
  ds.read_window(0, out.data());
  for (size_t i = 0; i < t.size(); ++i) EXPECT_EQ(out[i], static_cast<int32_t>(t[i]));
}

TEST_F(DatasetTest, LargeFileSpansChunks) {
  const int64_t n = kTokenChunk * 2 + 12345;
  make_file("big.h5", n, 50000);
  TokenDataset ds({path("big.h5")}, 1000, 50257);
  EXPECT_EQ(ds.num_tokens(), n);
  std::vector<int32_t> out(1001);
  const int64_t w = kTokenChunk / 1000;  // crosses the first chunk boundary
  ds.read_window(w, out.data());
  for (int64_t t = 0; t <= 1000; ++t) EXPECT_EQ(out[size_t(t)], (w * 1000 + t) % 50000);
}

TEST_F(DatasetTest, WindowArithmetic) {
  for (int64_t N : {11, 12, 13, 20, 21}) {
    make_file("w.h5", N, 256);
    const int T = 5;
    TokenDataset ds({path("w.h5")}, T, 256);
    EXPECT_EQ(ds.num_tokens(), N);
    EXPECT_EQ(ds.num_windows(), (N - 1) / T) << N;
    std::vector<int32_t> cur(T + 1), next(T + 1);
    for (int64_t w = 0; w < ds.num_windows(); ++w) {
      ds.read_window(w, cur.data());
      for (int t = 0; t <= T; ++t) EXPECT_EQ(cur[size_t(t)], w * T + t);
      if (w + 1 < ds.num_windows()) {
        ds.read_window(w + 1, next.data());
        EXPECT_EQ(cur[T], next[0]);
      }
    }
    EXPECT_THROW(ds.read_window(ds.num_windows(), cur.data()), Error);
    EXPECT_THROW(ds.read_window(-1, cur.data()), Error);
  }
}

TEST_F(DatasetTest, WindowsAcrossFiles) {
  make_file("a.h5", 7, 256, 0);
  make_file("empty.h5", 0, 256, 0);
  make_file("b.h5", 9, 256, 7);
  TokenDataset ds({path("a.h5"), path("empty.h5"), path("b.h5")}, 4, 256);
  EXPECT_EQ(ds.num_tokens(), 16);
  EXPECT_EQ(ds.num_windows(), 3);  // floor(15 / 4)
  std::vector<int32_t> out(5);
  for (int64_t w = 0; w < 3; ++w) {
    ds.read_window(w, out.data());  // window 1 = tokens 4..8, spans a.h5 and b.h5
    for (int t = 0; t <= 4; ++t) EXPECT_EQ(out[size_t(t)], w * 4 + t);
  }
}

TEST_F(DatasetTest, SequentialWrapsAround) {
  make_file("s.h5", 13, 256);  // T = 4: windows 0, 1, 2
  TokenDataset ds({path("s.h5")}, 4, 256);
  BatchSampler s(ds, "sequential", 1);
  for (int64_t i = 0; i < 10; ++i) EXPECT_EQ(s.window_of(i), i % 3);
  std::vector<int32_t> in(4 * 4), tg(4 * 4);
  s.load(2, 4, in.data(), tg.data());  // samples 2,3,4,5 -> windows 2,0,1,2
  const int64_t windows[] = {2, 0, 1, 2};
  for (int k = 0; k < 4; ++k)
    for (int t = 0; t < 4; ++t) {
      EXPECT_EQ(in[size_t(k * 4 + t)], windows[k] * 4 + t);
      EXPECT_EQ(tg[size_t(k * 4 + t)], windows[k] * 4 + t + 1);
    }
}

TEST_F(DatasetTest, ShuffleIsPermutationPerEpoch) {
  make_file("p.h5", 1001, 256);
  TokenDataset ds({path("p.h5")}, 10, 256);  // 100 windows
  const int64_t n = ds.num_windows();
  ASSERT_EQ(n, 100);
  BatchSampler s(ds, "shuffle", 1234);
  std::vector<std::vector<int64_t>> epochs(3);
  for (int64_t i = 0; i < 3 * n; ++i) epochs[size_t(i / n)].push_back(s.window_of(i));
  for (auto e : epochs) {
    std::sort(e.begin(), e.end());
    for (int64_t k = 0; k < n; ++k) EXPECT_EQ(e[size_t(k)], k);
  }
  EXPECT_NE(epochs[0], epochs[1]);
  EXPECT_NE(epochs[1], epochs[2]);
  std::vector<int64_t> identity(static_cast<size_t>(n));
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_NE(epochs[0], identity);

  // Deterministic: a second sampler (and going back an epoch) gives the same order.
  BatchSampler again(ds, "shuffle", 1234);
  for (int64_t i = 3 * n - 1; i >= 0; --i)
    EXPECT_EQ(again.window_of(i), epochs[size_t(i / n)][size_t(i % n)]);
  // A different seed gives a different order.
  BatchSampler other(ds, "shuffle", 1235);
  std::vector<int64_t> o;
  for (int64_t i = 0; i < n; ++i) o.push_back(other.window_of(i));
  EXPECT_NE(o, epochs[0]);
  // load() follows window_of().
  std::vector<int32_t> in(10), tg(10);
  s.load(n + 5, 1, in.data(), tg.data());
  EXPECT_EQ(in[0], epochs[1][5] * 10 % 256);
  EXPECT_EQ(tg[9], (epochs[1][5] * 10 + 10) % 256);
}

TEST_F(DatasetTest, ShuffleIsPinnedAcrossPlatforms) {
  // mt19937_64 and our Fisher-Yates are fully specified: this order must never change
  // (checkpoints record sample positions that rely on it).
  EXPECT_EQ(BatchSampler::permutation(10, 42, 0),
            (std::vector<int64_t>{2, 0, 4, 7, 8, 3, 5, 1, 9, 6}));
  EXPECT_EQ(BatchSampler::permutation(10, 42, 1),
            (std::vector<int64_t>{2, 8, 7, 3, 6, 4, 0, 9, 5, 1}));
  EXPECT_EQ(BatchSampler::permutation(10, 43, 0),
            (std::vector<int64_t>{1, 6, 4, 7, 0, 2, 3, 9, 5, 8}));
  auto p = BatchSampler::permutation(100000, 7, 5);
  std::set<int64_t> seen(p.begin(), p.end());
  EXPECT_EQ(seen.size(), 100000u);
  EXPECT_EQ(*seen.begin(), 0);
  EXPECT_EQ(*seen.rbegin(), 99999);
  EXPECT_EQ(BatchSampler::permutation(1, 7, 3), std::vector<int64_t>{0});
  EXPECT_TRUE(BatchSampler::permutation(0, 7, 3).empty());
}

TEST_F(DatasetTest, BadSamplingName) {
  make_file("x.h5", 100, 256);
  TokenDataset ds({path("x.h5")}, 4, 256);
  expect_error([&] { BatchSampler s(ds, "random", 1); }, {"random", "sequential", "shuffle"});
}

TEST_F(DatasetTest, ConvertLlmcShards) {
  std::vector<uint16_t> a = {50256, 1, 2, 3, 4, 5, 6, 7};
  std::vector<uint16_t> b = {100, 200, 300};
  make_shard("a.bin", a);
  make_shard("b.bin", b);
  auto info = convert_llmc({path("a.bin"), path("b.bin")}, path("out.h5"));
  EXPECT_EQ(info.num_tokens, 11);
  EXPECT_EQ(info.vocab_size, 50257);
  EXPECT_EQ(info.tokenizer, "gpt2");
  EXPECT_EQ(info.dtype, "uint16");
  TokenDataset ds({path("out.h5")}, 10, 50257);
  std::vector<int32_t> out(11);
  ds.read_window(0, out.data());
  std::vector<int32_t> want(a.begin(), a.end());
  want.insert(want.end(), b.begin(), b.end());
  EXPECT_EQ(out, want);
  EXPECT_EQ(ds.tokenizer(), "gpt2");
}

TEST_F(DatasetTest, ConvertLlmcErrors) {
  make_shard("magic.bin", {1, 2, 3}, 12345);
  expect_error([&] { convert_llmc({path("magic.bin")}, path("o.h5")); },
               {"magic.bin", "bad magic"});
  make_shard("version.bin", {1, 2, 3}, kLlmcMagic, 7);
  expect_error([&] { convert_llmc({path("version.bin")}, path("o.h5")); },
               {"version.bin", "version 7"});
  make_shard("short.bin", {1, 2, 3}, kLlmcMagic, kLlmcVersion, -1, 2);
  expect_error([&] { convert_llmc({path("short.bin")}, path("o.h5")); },
               {"short.bin", "truncated"});
  write_bytes(path("tiny.bin"), {1, 2, 3});
  expect_error([&] { convert_llmc({path("tiny.bin")}, path("o.h5")); }, {"tiny.bin", "truncated"});
  make_shard("long.bin", {1, 2, 3}, kLlmcMagic, kLlmcVersion, 2);
  expect_error([&] { convert_llmc({path("long.bin")}, path("o.h5")); },
               {"long.bin", "bytes after"});
  make_shard("vocab.bin", {1, 50257});
  expect_error([&] { convert_llmc({path("vocab.bin")}, path("o.h5")); },
               {"vocab.bin", "token 50257 at index 1"});
  expect_error([&] { convert_llmc({path("missing.bin")}, path("o.h5")); },
               {"missing.bin: no such file"});
  // A good shard after a bad one: nothing is written.
  make_shard("good.bin", {1, 2, 3});
  expect_error(
      [&] {
        convert_llmc({path("good.bin"), path("magic.bin")}, path("o.h5"));
      },
      {"magic.bin"});
  EXPECT_FALSE(fs::exists(path("o.h5")));
  EXPECT_FALSE(fs::exists(path("o.h5.tmp")));
}

TEST_F(DatasetTest, ConvertText) {
  std::ofstream(path("a.txt")) << "hello";
  std::ofstream(path("b.txt")) << " w\xc3\xb6rld\n";
  auto info = convert_text({path("a.txt"), path("b.txt")}, path("t.h5"));
  EXPECT_EQ(info.num_tokens, 13);
  EXPECT_EQ(info.vocab_size, 256);
  EXPECT_EQ(info.tokenizer, "byte");
  EXPECT_EQ(info.dtype, "uint16");
  TokenDataset ds({path("t.h5")}, 12, 256);
  std::vector<int32_t> out(13);
  ds.read_window(0, out.data());
  const std::string all = "hello w\xc3\xb6rld\n";
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(out[i], static_cast<unsigned char>(all[i]));
  expect_error([&] { convert_text({path("nope.txt")}, path("t2.h5")); },
               {"nope.txt: no such file"});
}

TEST_F(DatasetTest, ConvertRaw) {
  write_bytes(path("r16.bin"), {1, 0, 0, 1, 0xff, 0xff});  // 1, 256, 65535
  auto info = convert_raw({path("r16.bin")}, path("r16.h5"), "u16", 65536);
  EXPECT_EQ(info.num_tokens, 3);
  EXPECT_EQ(info.dtype, "uint16");
  write_bytes(path("r32.bin"), {1, 0, 0, 0, 0, 0, 1, 0});  // 1, 65536
  info = convert_raw({path("r32.bin")}, path("r32.h5"), "u32", 100000, "mine");
  EXPECT_EQ(info.dtype, "uint32");
  TokenDataset ds({path("r32.h5")}, 1, 100000);
  std::vector<int32_t> out(2);
  ds.read_window(0, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{1, 65536}));
  EXPECT_EQ(ds.tokenizer(), "mine");
  expect_error([&] { convert_raw({path("r16.bin")}, path("x.h5"), "u16", 1000); },
               {"r16.bin", "token 65535 at index 2"});
  write_bytes(path("odd.bin"), {1, 2, 3});
  expect_error([&] { convert_raw({path("odd.bin")}, path("x.h5"), "u16", 1000); }, {"odd.bin"});
  expect_error([&] { convert_raw({path("r16.bin")}, path("x.h5"), "u8", 10); }, {"u8"});
}

TEST_F(DatasetTest, WriterRejectsBadTokensAndLeavesNoFile) {
  std::vector<uint32_t> t = {1, 2, 300};
  expect_error([&] { write_token_file(path("bad.h5"), t, 256, "byte"); },
               {"bad.h5", "token 300 at position 2"});
  EXPECT_FALSE(fs::exists(path("bad.h5")));
  EXPECT_FALSE(fs::exists(path("bad.h5.tmp")));
  // A missing folder is made (`-o data/x.h5` in a fresh checkout); one that cannot be
  // (a file stands in its way) is an error naming the output.
  write_token_file(path("new/dir/x.h5"), t, 1000, "byte");
  EXPECT_TRUE(fs::exists(path("new/dir/x.h5")));
  { std::ofstream(path("plain")) << "x"; }
  expect_error([&] { write_token_file(path("plain/x.h5"), t, 1000, "byte"); }, {"plain/x.h5"});
}

TEST_F(DatasetTest, ErrorMissingFile) {
  expect_error([&] { TokenDataset ds({path("data.h5")}, 4, 256); },
               {path("data.h5") + ": no such file"});
}

TEST_F(DatasetTest, ErrorNotHdf5) {
  std::ofstream(path("data.h5")) << "this is not HDF5\n";
  expect_error([&] { TokenDataset ds({path("data.h5")}, 4, 256); },
               {path("data.h5") + ": not an HDF5 file"});
  fs::create_directory(path("dir.h5"));
  expect_error([&] { TokenDataset ds({path("dir.h5")}, 4, 256); }, {"dir.h5"});
  std::ofstream(path("empty.h5")).flush();
  expect_error([&] { TokenDataset ds({path("empty.h5")}, 4, 256); },
               {"empty.h5: not an HDF5 file"});
}

TEST_F(DatasetTest, ErrorNoTokensDataset) {
  write_h5(path("data.h5"), "other", H5T_STD_U16LE, {100});
  expect_error([&] { TokenDataset ds({path("data.h5")}, 4, 256); }, {"data.h5", "no /tokens"});
  hid_t f = H5Fcreate(path("group.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  H5Gclose(H5Gcreate2(f, "tokens", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  H5Fclose(f);
  expect_error([&] { TokenDataset ds({path("group.h5")}, 4, 256); }, {"group.h5", "not a dataset"});
}

TEST_F(DatasetTest, ErrorWrongRankOrType) {
  write_h5(path("rank.h5"), "tokens", H5T_STD_U16LE, {10, 10});
  expect_error([&] { TokenDataset ds({path("rank.h5")}, 4, 256); }, {"rank.h5", "rank 2"});
  write_h5(path("int32.h5"), "tokens", H5T_STD_I32LE, {100});
  expect_error([&] { TokenDataset ds({path("int32.h5")}, 4, 256); }, {"int32.h5", "int32"});
  write_h5(path("float.h5"), "tokens", H5T_IEEE_F32LE, {100});
  expect_error([&] { TokenDataset ds({path("float.h5")}, 4, 256); }, {"float.h5", "float32"});
  write_h5(path("u8.h5"), "tokens", H5T_STD_U8LE, {100});
  expect_error([&] { TokenDataset ds({path("u8.h5")}, 4, 256); }, {"u8.h5", "uint8"});
}

TEST_F(DatasetTest, ErrorVocabExceedsModel) {
  make_file("data.h5", 1000, 50257);
  expect_error([&] { TokenDataset ds({path("data.h5")}, 4, 256); },
               {path("data.h5") + ": vocab_size 50257 exceeds model.vocab_size 256"});
}

TEST_F(DatasetTest, ErrorTooFewTokens) {
  make_file("data.h5", 100, 256);
  expect_error([&] { TokenDataset ds({path("data.h5")}, 256, 256); },
               {path("data.h5") + ": 100 tokens, need at least seq_len+1 = 257"});
  TokenDataset exact({path("data.h5")}, 99, 256);  // 100 = 99 + 1 tokens: one window
  EXPECT_EQ(exact.num_windows(), 1);
}

TEST_F(DatasetTest, ErrorTokenOutOfModelVocab) {
  // No vocab_size attribute: the bad token is only found while reading.
  std::vector<uint16_t> t(50, 3);
  t[37] = 300;
  hid_t f = H5Fcreate(path("data.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  hsize_t n = t.size();
  hid_t s = H5Screate_simple(1, &n, nullptr);
  hid_t d = H5Dcreate2(f, "tokens", H5T_STD_U16LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(d, H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data());
  H5Dclose(d);
  H5Sclose(s);
  H5Fclose(f);
  TokenDataset ds({path("data.h5")}, 10, 256);
  EXPECT_EQ(ds.vocab_size(), 0);
  EXPECT_EQ(ds.tokenizer(), "");
  std::vector<int32_t> out(11);
  ds.read_window(0, out.data());
  ds.read_window(2, out.data());
  expect_error([&] { ds.read_window(3, out.data()); }, {"data.h5", "token 300 at index 37"});
}

TEST_F(DatasetTest, ErrorMismatchedTokenizers) {
  make_file("a.h5", 50, 256);
  write_token_file(path("b.h5"), std::vector<uint32_t>(50, 1), 256, "other");
  expect_error(
      [&] {
        TokenDataset ds({path("a.h5"), path("b.h5")}, 4, 256);
      },
      {"b.h5", "tokenizer other", "a.h5"});
}

}  // namespace
}  // namespace pipetrain
