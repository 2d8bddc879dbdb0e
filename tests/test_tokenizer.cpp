// Tests for the tokenizers (io/tokenizer.hpp): GPT-2's BPE on known ids, decode(encode(x))
// == x, the streaming cut (encoding in parts gives the ids of the whole), tokenize_text
// with any block size, tiktoken ranks files, and the errors (each names the file).
// tests/cli/tokenizer_oracle.sh compares the ids with OpenAI's tiktoken itself.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>

#include <fmt/format.h>

#include "pipetrain/core/error.hpp"
#include "test_files.hpp"
#include "pipetrain/io/data_convert.hpp"
#include "pipetrain/io/token_dataset.hpp"
#include "pipetrain/io/tokenizer.hpp"
#include "pipetrain/io/tokenizer_bpe.hpp"

namespace pipetrain {
namespace {

namespace fs = std::filesystem;

const Tokenizer& gpt2() {
  static const auto tok = make_tokenizer("gpt2");
  return *tok;
}

std::vector<int32_t> encode(const Tokenizer& t, std::string_view text) {
  std::vector<int32_t> ids;
  t.encode(text, ids);
  return ids;
}

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string sample() { return read(std::string(PIPETRAIN_SOURCE_DIR) + "/tests/data/unicode_sample.txt"); }

using TokenizerFiles = testing::TempDirTest;

void expect_error(const std::function<void()>& f, const std::string& needle) {
  testing::expect_one_line_error(f, {needle});
}

TEST(Gpt2Tokenizer, KnownIdsVocabularyAndEndOfText) {
  // Ids as tiktoken's gpt2 encoding gives them.
  EXPECT_EQ(encode(gpt2(), "Hello world"), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(encode(gpt2(), " it's"), (std::vector<int32_t>{340, 338}));
  EXPECT_EQ(encode(gpt2(), "   spaces\n"), (std::vector<int32_t>{220, 220, 9029, 198}));
  EXPECT_EQ(gpt2().vocab_size(), 50257);
  EXPECT_EQ(gpt2().end_of_text(), 50256);
  EXPECT_EQ(gpt2().name(), "gpt2");
  // Special tokens' text is ordinary text, not the special id.
  const auto ids = encode(gpt2(), "<|endoftext|>");
  EXPECT_GT(ids.size(), 1u);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 50256), 0);
  EXPECT_EQ(gpt2().decode(std::vector<int32_t>{50256}), "<|endoftext|>");
}

TEST(Gpt2Tokenizer, DecodeOfEncodeIsTheText) {
  const std::string text = sample();
  const auto ids = encode(gpt2(), text);
  EXPECT_EQ(gpt2().decode(ids), text);
  for (int32_t id : ids) EXPECT_LT(id, 50256);
  expect_error([] { (void)gpt2().decode(std::vector<int32_t>{50257}); }, "outside the vocabulary");
}

TEST(Gpt2Tokenizer, InvalidUtf8IsAnErrorWithItsPosition) {
  std::vector<int32_t> ids;
  expect_error([&] { gpt2().encode("abc \xc3 def", ids, "input.txt", 100); }, "input.txt is not valid UTF-8 at byte 104");
}

// The streaming cut: for random texts over an alphabet of every kind of character the
// pattern distinguishes, encoding up to stream_split() and then the rest gives the ids
// of the whole.
TEST(StreamSplit, EncodingThePartsGivesTheWhole) {
  const std::vector<std::string> alphabet = {"a", "b", "Z", " ", " ", "  ", "\n", "\t", "'", "s", "1", "23", ".",
                                             ",", "é", "日", "🤖", "\xc2\x85", "\xc2\xa0", "'ll", "\r\n"};
  std::mt19937 rng(7);
  int cuts = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string text;
    const int n = 1 + static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) text += alphabet[rng() % alphabet.size()];
    const size_t cut = stream_split(text);
    if (cut == 0) continue;
    ++cuts;
    ASSERT_LT(cut, text.size());
    EXPECT_EQ(text[cut], ' ');
    auto parts = encode(gpt2(), std::string_view(text).substr(0, cut));
    const auto rest = encode(gpt2(), std::string_view(text).substr(cut));
    parts.insert(parts.end(), rest.begin(), rest.end());
    ASSERT_EQ(parts, encode(gpt2(), text)) << "cut at " << cut << " of '" << text << "'";
  }
  EXPECT_GT(cuts, 300);  // the property was exercised
  EXPECT_EQ(stream_split("nospaceshere"), 0u);
  EXPECT_EQ(stream_split("a  b"), 0u);  // a run of spaces is no place to cut
  EXPECT_EQ(stream_split("one two three"), 7u);
}

// tokenize_text streams in blocks; whatever the block size, the dataset holds the ids of
// encoding each file whole, and --eot's token after each file.
TEST_F(TokenizerFiles, TokenizeTextMatchesWholeEncodingForAnyBlockSize) {
  const std::string text = sample();
  const std::string a = write("a.txt", text), b = write("b.txt", "second file, short.");
  std::vector<int32_t> expected = encode(gpt2(), text);
  expected.push_back(50256);
  const auto second = encode(gpt2(), "second file, short.");
  expected.insert(expected.end(), second.begin(), second.end());
  expected.push_back(50256);
  for (size_t block : {size_t{1}, size_t{3}, size_t{17}, size_t{4096}, size_t{1} << 22}) {
    SCOPED_TRACE(block);
    const std::string out = path(fmt::format("t{}.h5", block));
    const TokenFileInfo info = tokenize_text({a, b}, out, gpt2(), true, {}, block);
    EXPECT_EQ(info.num_tokens, static_cast<int64_t>(expected.size()));
    EXPECT_EQ(info.tokenizer, "gpt2");
    EXPECT_EQ(inspect_token_file(out).vocab_size, 50257);
    TokenDataset ds({out}, 1, 50257);
    std::vector<int32_t> got(expected.size());
    ds.read_tokens(0, static_cast<int64_t>(got.size()), got.data());
    EXPECT_EQ(got, expected);
  }
  // The byte tokenizer through the same path: every byte a token, no end-of-text.
  const TokenFileInfo bytes = tokenize_text({b}, path("bytes.h5"), *make_tokenizer("byte"), false);
  EXPECT_EQ(bytes.num_tokens, 19);
  EXPECT_EQ(bytes.tokenizer, "byte");
  expect_error([&] { tokenize_text({b}, path("x.h5"), *make_tokenizer("byte"), true); }, "no end-of-text token");
  expect_error([&] { tokenize_text({path("missing.txt")}, path("x.h5"), gpt2(), false); }, "missing.txt: no such file");
  const std::string bad = write("bad.txt", "good text \xff then");
  expect_error([&] { tokenize_text({bad}, path("x.h5"), gpt2(), false, {}, 4); }, "bad.txt is not valid UTF-8 at byte 10");
  EXPECT_FALSE(fs::exists(path("x.h5")));
  EXPECT_FALSE(fs::exists(path("x.h5.tmp")));
}

// Base64, as tiktoken ranks files spell a token's bytes.
std::string b64(const std::string& bytes) {
  static const char* digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  int acc = 0, bits = 0;
  for (unsigned char c : bytes) {
    acc = (acc << 8) | c;
    bits += 8;
    while (bits >= 6) out.push_back(digits[(acc >> (bits -= 6)) & 63]);
  }
  if (bits > 0) out.push_back(digits[(acc << (6 - bits)) & 63]);
  while (out.size() % 4) out.push_back('=');
  return out;
}

// A tiktoken ranks file: the 256 bytes, then merges "ab" (256) and "abab" (257).
TEST_F(TokenizerFiles, TiktokenRanksFileMergesByRank) {
  std::ostringstream lines;
  for (int b = 0; b < 256; ++b) lines << b64(std::string(1, static_cast<char>(b))) << ' ' << b << '\n';
  lines << b64("ab") << " 256\n" << b64("abab") << " 257\n";
  const std::string ranks = lines.str();
  const std::string file = write("tiny.tiktoken", ranks);
  // Which pattern splits text for it is not in the file: a bare path is refused.
  expect_error([&] { (void)make_tokenizer(file); }, "which pre-tokenizer pattern");
  const auto tok = make_tokenizer("gpt2:" + file);
  EXPECT_EQ(tok->vocab_size(), 258);
  EXPECT_EQ(tok->name(), "gpt2:" + file);  // what a dataset records, and make_tokenizer takes back
  EXPECT_EQ(make_tokenizer(tok->name())->name(), tok->name());
  EXPECT_FALSE(tok->end_of_text());
  EXPECT_EQ(encode(*tok, "ababab"), (std::vector<int32_t>{257, 256}));
  EXPECT_EQ(encode(*tok, "abc ab"), (std::vector<int32_t>{256, 'c', ' ', 256}));  // " ab" is one piece: ' ' then "ab"
  EXPECT_EQ(tok->decode(encode(*tok, "ababab c")), "ababab c");

  const std::string broken = write("broken.tiktoken", ranks + std::string("not-base64! 9\n"));
  expect_error([&] { (void)make_tokenizer("gpt2:" + broken); }, "broken.tiktoken:259: expected \"base64(bytes) rank\"");
  // A rank far beyond the entries would size the vocabulary by it (found by fuzz_text_formats).
  const std::string huge = write("huge.tiktoken", ranks + std::string("Zm9v 2147483000\n"));
  expect_error([&] { (void)make_tokenizer("gpt2:" + huge); }, "huge.tiktoken: rank 2147483000 with only 259 entries");
  const std::string short_ranks = write("short.tiktoken", b64("a") + " 0\n");
  expect_error([&] { (void)make_tokenizer("gpt2:" + short_ranks); }, "short.tiktoken: byte 0 has no rank");
}

// The pattern decides the pieces, and so the ids: digits are one piece for GPT-2, runs of at
// most three for cl100k_base and Llama 3; cl100k_base takes a symbol into the word after
// it. A file named after its encoding needs no pattern name.
TEST_F(TokenizerFiles, ThePatternOfTheVocabularySplitsItsText) {
  std::ostringstream lines;
  const auto add = [&](const std::string& bytes, int rank) { lines << b64(bytes) << ' ' << rank << '\n'; };
  for (int b = 0; b < 256; ++b) add(std::string(1, static_cast<char>(b)), b);
  add("12", 256);
  add("123", 257);
  add("1234", 258);
  add(".x", 259);
  const std::string file = write("cl100k_base.tiktoken", lines.str());
  const auto gpt2 = make_tokenizer("gpt2:" + file), cl100k = make_tokenizer(file), llama3 = make_tokenizer("llama3:" + file);
  EXPECT_EQ(cl100k->name(), "cl100k_base:" + file);
  EXPECT_EQ(encode(*gpt2, "1234"), (std::vector<int32_t>{258}));
  EXPECT_EQ(encode(*cl100k, "1234"), (std::vector<int32_t>{257, '4'}));
  EXPECT_EQ(encode(*llama3, "1234"), (std::vector<int32_t>{257, '4'}));
  EXPECT_EQ(encode(*gpt2, ".x"), (std::vector<int32_t>{'.', 'x'}));
  EXPECT_EQ(encode(*cl100k, ".x"), (std::vector<int32_t>{259}));
  const auto o200k = make_tokenizer("o200k_base:" + file);
  EXPECT_EQ(encode(*o200k, "12345 .x"), (std::vector<int32_t>{257, '4', '5', ' ', '.', 'x'}));
  EXPECT_EQ(encode(*gpt2, "12345 .x"), (std::vector<int32_t>{258, '5', ' ', '.', 'x'}));
  expect_error([&] { (void)make_tokenizer("gpt4:" + file); }, "PATTERN:RANKS_FILE");
}

TEST_F(TokenizerFiles, BadGpt2FilesNameTheFile) {
  const std::string dir = bundled_tokenizers_dir() + "/gpt2";
  expect_error([&] { (void)make_gpt2_bpe(write("e.json", "{not json"), dir + "/vocab.bpe"); }, "e.json: not valid JSON");
  expect_error([&] { (void)make_gpt2_bpe(path("none.json"), dir + "/vocab.bpe"); }, "none.json: cannot open");
  // Merges out of order: the ranks would not be what BPE with these merges gives.
  std::string merges = read(dir + "/vocab.bpe");
  const auto first = merges.find('\n') + 1, second = merges.find('\n', first) + 1, third = merges.find('\n', second) + 1;
  std::ostringstream swapped_text;
  swapped_text << merges.substr(0, first) << merges.substr(second, third - second) << merges.substr(first, second - first)
               << merges.substr(third);
  const std::string swapped = swapped_text.str();
  expect_error([&] { (void)make_gpt2_bpe(dir + "/encoder.json", write("v.bpe", swapped)); }, "v.bpe:2: merge");
  expect_error([] { (void)make_tokenizer("gpt3"); }, "tokenizer 'gpt3': expected byte, gpt2, or PATTERN:RANKS_FILE");
}

}  // namespace
}  // namespace pipetrain
