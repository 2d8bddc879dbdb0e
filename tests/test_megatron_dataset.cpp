// Megatron-LM indexed datasets (io/megatron_dataset.hpp) read in place: tokens of every
// integer dtype, document starts, windows inside documents (data.respect_documents), the
// conversion to HDF5, and each malformed file's one-line error naming it.
// tests/cli/megatron_dataset.sh writes the files with an independent Python writer.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include <fmt/format.h>

#include "pipetrain/core/error.hpp"
#include "test_files.hpp"
#include "pipetrain/io/data_convert.hpp"
#include "pipetrain/io/megatron_dataset.hpp"
#include "pipetrain/io/token_dataset.hpp"

namespace pipetrain {
namespace {

namespace fs = std::filesystem;

// Writes PREFIX.bin/.idx: documents of the given token lists, one sequence each, as `code`
// (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 8 uint16).
struct Writer {
  uint8_t code = 8;
  std::string magic = std::string("MMIDIDX\0\0", 9);
  uint64_t version = 1;
  void write(const std::string& prefix, const std::vector<std::vector<int64_t>>& docs) const {
    const int width = code == 1 || code == 2 ? 1 : code == 3 || code == 8 ? 2 : code == 4 ? 4 : 8;
    std::ofstream bin(prefix + ".bin", std::ios::binary), idx(prefix + ".idx", std::ios::binary);
    std::vector<int32_t> lengths;
    std::vector<int64_t> pointers, doc_index{0};
    int64_t at = 0;
    for (const auto& d : docs) {
      for (int64_t t : d) bin.write(reinterpret_cast<const char*>(&t), width);  // little-endian low bytes
      lengths.push_back(static_cast<int32_t>(d.size()));
      pointers.push_back(at);
      at += static_cast<int64_t>(d.size()) * width;
      doc_index.push_back(static_cast<int64_t>(lengths.size()));
    }
    const uint64_t s = lengths.size(), n = doc_index.size();
    idx.write(magic.data(), 9);
    idx.write(reinterpret_cast<const char*>(&version), 8);
    idx.write(reinterpret_cast<const char*>(&code), 1);
    idx.write(reinterpret_cast<const char*>(&s), 8);
    idx.write(reinterpret_cast<const char*>(&n), 8);
    idx.write(reinterpret_cast<const char*>(lengths.data()), static_cast<std::streamsize>(4 * s));
    idx.write(reinterpret_cast<const char*>(pointers.data()), static_cast<std::streamsize>(8 * s));
    idx.write(reinterpret_cast<const char*>(doc_index.data()), static_cast<std::streamsize>(8 * n));
  }
};

using MegatronTest = testing::TempDirTest;

void expect_error(const std::function<void()>& f, const std::string& needle) {
  testing::expect_one_line_error(f, {needle});
}

const std::vector<std::vector<int64_t>> kDocs = {{1, 2, 3, 4, 5, 6, 7}, {8, 9}, {10, 11, 12, 13, 14, 15, 16, 17, 18}};

TEST_F(MegatronTest, EveryIntegerDtypeReadsTheSameTokens) {
  for (uint8_t code : {1, 2, 3, 4, 5, 8}) {
    SCOPED_TRACE(int{code});
    const std::string prefix = path(fmt::format("d{}", code));
    Writer{code}.write(prefix, kDocs);
    const MegatronDataset ds(prefix);
    EXPECT_EQ(ds.num_tokens(), 18);
    EXPECT_EQ(ds.document_starts(), (std::vector<int64_t>{0, 7, 9, 18}));
    std::vector<int32_t> got(18);
    ds.read(0, 18, got.data());
    for (int i = 0; i < 18; ++i) EXPECT_EQ(got[static_cast<size_t>(i)], i + 1);
  }
}

TEST_F(MegatronTest, TokenDatasetReadsAPrefixAndRespectsDocuments) {
  const std::string prefix = path("corpus");
  Writer{}.write(prefix, kDocs);
  // Windows of 3 + 1 tokens over the stream: starts 0, 3, 6, 9, 12 (18 tokens: 5 windows).
  const TokenDataset flat({prefix}, 3, 100);
  EXPECT_EQ(flat.num_windows(), 5);
  std::vector<int32_t> w(4);
  flat.read_window(2, w.data());  // crosses from document 0 into document 1
  EXPECT_EQ(w, (std::vector<int32_t>{7, 8, 9, 10}));
  // Inside documents: document 0 (7 tokens) starts 0, 3; document 1 (2) none; document 2
  // (9 tokens from 9) starts 9, 12.
  const TokenDataset docs({prefix}, 3, 100, true);
  EXPECT_EQ(docs.num_windows(), 4);
  std::vector<int64_t> starts;
  for (int64_t i = 0; i < docs.num_windows(); ++i) starts.push_back(docs.window_start(i));
  EXPECT_EQ(starts, (std::vector<int64_t>{0, 3, 9, 12}));
  docs.read_window(3, w.data());
  EXPECT_EQ(w, (std::vector<int32_t>{13, 14, 15, 16}));
  // Two sources: the second's documents follow the first's tokens.
  const TokenDataset two({prefix, prefix}, 3, 100, true);
  EXPECT_EQ(two.num_windows(), 8);
  EXPECT_EQ(two.window_start(4), 18);
  // A token the model's vocabulary cannot hold; HDF5 files cannot respect documents.
  expect_error([&] { TokenDataset({prefix}, 3, 10).read_window(3, w.data()); }, "corpus: token 10 at index 9 is >= model.vocab_size 10");
  const TokenFileInfo h5 = convert_megatron(prefix, path("c.h5"));
  EXPECT_EQ(h5.num_tokens, 18);
  EXPECT_EQ(h5.vocab_size, 19);  // the largest token + 1
  expect_error([&] { TokenDataset({path("c.h5")}, 3, 100, true); }, "c.h5: data.respect_documents needs");
  const TokenDataset converted({path("c.h5")}, 3, 100);
  std::vector<int32_t> a(18), b(18);
  converted.read_tokens(0, 18, a.data());
  flat.read_tokens(0, 18, b.data());
  EXPECT_EQ(a, b);
}

TEST_F(MegatronTest, MalformedFilesNameTheFile) {
  const std::string p = path("bad");
  Writer bad_magic;
  bad_magic.magic = std::string("NOTANIDX\0", 9);
  bad_magic.write(p, kDocs);
  expect_error([&] { MegatronDataset ds(p); }, "bad.idx: not a Megatron index");
  Writer v2;
  v2.version = 2;
  v2.write(p, kDocs);
  expect_error([&] { MegatronDataset ds(p); }, "bad.idx: index version 2");
  Writer floats;
  floats.code = 7;
  floats.write(p, kDocs);
  expect_error([&] { MegatronDataset ds(p); }, "float type, not token ids");
  Writer{}.write(p, kDocs);
  fs::resize_file(p + ".bin", 30);
  expect_error([&] { MegatronDataset ds(p); }, "bad.bin: 30 bytes, but");
  Writer{}.write(p, kDocs);
  fs::resize_file(p + ".idx", 40);
  expect_error([&] { MegatronDataset ds(p); }, "bad.idx: truncated index");
  {  // a document index beyond the sequences (found by fuzz_text_formats)
    Writer{}.write(p, kDocs);
    std::fstream idx(p + ".idx", std::ios::binary | std::ios::in | std::ios::out);
    idx.seekp(9 + 8 + 1 + 8 + 8 + 3 * 4 + 3 * 8 + 8);  // document index 1
    const int64_t beyond = 246;
    idx.write(reinterpret_cast<const char*>(&beyond), 8);
  }
  expect_error([&] { MegatronDataset ds(p); }, "bad.idx: document index 1 is 246");
  Writer{4}.write(p, {{1, -5, 3}});
  MegatronDataset neg(p);
  std::vector<int32_t> out(3);
  expect_error([&] { neg.read(0, 3, out.data()); }, "bad.bin: token -5 at index 1 is not a token id");
  expect_error([&] { TokenDataset({path("nothing")}, 3, 100); }, "nothing");
}

}  // namespace
}  // namespace pipetrain
