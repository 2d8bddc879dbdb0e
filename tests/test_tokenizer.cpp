// Tests for the tokenizers (io/tokenizer.hpp): GPT-2's BPE on known ids, decode(encode(x))
// == x, the streaming cut (encoding in parts gives the ids of the whole), tokenize_text
// with any block size, tiktoken ranks files, each encoding's special tokens (ids, the
// vocabulary, decode, never from ordinary text, end-of-text in datasets and packing), and
// the errors (each names the file).
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
#include "pipetrain/io/tokenizer_special.hpp"

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
  EXPECT_EQ(tok->vocab_size(), 50257);  // the gpt2 encoding's <|endoftext|> is 50256
  EXPECT_EQ(tok->name(), "gpt2:" + file);  // what a dataset records, and make_tokenizer takes back
  EXPECT_EQ(make_tokenizer(tok->name())->name(), tok->name());
  EXPECT_EQ(tok->end_of_text(), 50256);
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

// The special tokens as tiktoken (openai_public.py; tests/cli/tokenizer_oracle.sh checks
// them against npm's tiktoken too) and Meta's Llama 3 tokenizer.py define them.
std::vector<std::pair<std::string, int32_t>> pairs(std::span<const SpecialToken> tokens) {
  std::vector<std::pair<std::string, int32_t>> out;
  for (const SpecialToken& t : tokens) out.emplace_back(t.text, t.id);
  return out;
}

TEST(SpecialTokens, TiktokensEncodingsDefineThese) {
  using P = std::vector<std::pair<std::string, int32_t>>;
  for (const char* gpt2_like : {"gpt2", "r50k_base", "p50k_base"})
    EXPECT_EQ(pairs(encoding_special_tokens(gpt2_like)), (P{{"<|endoftext|>", 50256}})) << gpt2_like;
  EXPECT_EQ(pairs(encoding_special_tokens("cl100k_base")), (P{{"<|endoftext|>", 100257},
                                                              {"<|fim_prefix|>", 100258},
                                                              {"<|fim_middle|>", 100259},
                                                              {"<|fim_suffix|>", 100260},
                                                              {"<|endofprompt|>", 100276}}));
  EXPECT_EQ(pairs(encoding_special_tokens("o200k_base")), (P{{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}}));
  EXPECT_EQ(encoding_end_of_text("gpt2"), 50256);
  EXPECT_EQ(encoding_end_of_text("cl100k_base"), 100257);
  EXPECT_EQ(encoding_end_of_text("o200k_base"), 199999);
  EXPECT_TRUE(encoding_special_tokens("byte").empty());
  EXPECT_FALSE(encoding_end_of_text("byte"));
}

// Meta's list (meta-llama/llama3, llama/tokenizer.py), written here id by id: 128000 on,
// two named, four reserved, the chat headers, a reserved one, <|eot_id|>, then reserved
// ones numbered from 5 up to 128255.
std::string meta_llama3_special(int32_t id) {
  switch (id) {
    case 128000: return "<|begin_of_text|>";
    case 128001: return "<|end_of_text|>";
    case 128006: return "<|start_header_id|>";
    case 128007: return "<|end_header_id|>";
    case 128008: return "<|reserved_special_token_4|>";
    case 128009: return "<|eot_id|>";
    default: break;
  }
  if (id >= 128002 && id <= 128005) return fmt::format("<|reserved_special_token_{}|>", id - 128002);
  return fmt::format("<|reserved_special_token_{}|>", id - 128005);
}

TEST(SpecialTokens, Llama3HasMetasTwoHundredFiftySix) {
  const std::vector<SpecialToken> tokens = encoding_special_tokens("llama3");
  ASSERT_EQ(tokens.size(), 256u);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t id = 128000 + static_cast<int32_t>(i);
    EXPECT_EQ(tokens[i].id, id);
    EXPECT_EQ(tokens[i].text, meta_llama3_special(id));
  }
  EXPECT_EQ(tokens.back().text, "<|reserved_special_token_250|>");
  EXPECT_EQ(encoding_end_of_text("llama3"), 128001);  // <|end_of_text|>, not <|eot_id|> (a chat turn's end)
}

// The 256 bytes as ranks 0..255 and "ab" as 256: a ranks file any encoding's tests can use.
std::string byte_ranks() {
  std::ostringstream lines;
  for (int b = 0; b < 256; ++b) lines << b64(std::string(1, static_cast<char>(b))) << ' ' << b << '\n';
  lines << b64("ab") << " 256\n";
  return lines.str();
}

struct EncodingCase {
  std::string encoding;
  int64_t vocab;
  int32_t end_of_text;
};

// Each encoding's tokenizer: its vocabulary counts the special tokens; decode of a special
// id gives its text; ordinary text spelling one never gives its id; encode_with_special
// does, and decodes back; the end-of-text token from the tokenizer and from the spec alone.
TEST_F(TokenizerFiles, EachEncodingHasItsSpecialTokens) {
  const std::string ranks = write("ranks.tiktoken", byte_ranks());
  const std::vector<EncodingCase> cases = {
      {"gpt2", 50257, 50256}, {"cl100k_base", 100277, 100257}, {"o200k_base", 200019, 199999}, {"llama3", 128256, 128001}};
  for (const EncodingCase& c : cases) {
    SCOPED_TRACE(c.encoding);
    const std::string spec = c.encoding + ":" + ranks;
    const auto tok = make_tokenizer(spec);
    EXPECT_EQ(tok->vocab_size(), c.vocab);
    EXPECT_EQ(tok->end_of_text(), c.end_of_text);
    EXPECT_EQ(end_of_text_of(spec), c.end_of_text);
    EXPECT_EQ(pairs(tok->special_tokens()), pairs(encoding_special_tokens(c.encoding)));
    std::string text = "ab <|endoftext";  // a broken one is text
    std::vector<int32_t> with_ids = {256, ' ', '<', '|', 'e', 'n', 'd', 'o', 'f', 't', 'e', 'x', 't'};
    for (const SpecialToken& s : tok->special_tokens()) {
      EXPECT_EQ(tok->decode(std::vector<int32_t>{s.id}), s.text);
      text += s.text + "ab";
      with_ids.push_back(s.id);
      with_ids.push_back(256);
    }
    const std::vector<int32_t> ordinary = encode(*tok, text);
    for (const SpecialToken& s : tok->special_tokens())
      ASSERT_EQ(std::count(ordinary.begin(), ordinary.end(), s.id), 0) << s.text << " came from ordinary text";
    EXPECT_EQ(tok->decode(ordinary), text);
    std::vector<int32_t> special;
    encode_with_special(*tok, text, special);
    EXPECT_EQ(special, with_ids);
    EXPECT_EQ(tok->decode(special), text);
  }
  // GPT-2's bundled files: the same token; byte has none, and encode_with_special is encode.
  EXPECT_EQ(pairs(gpt2().special_tokens()), pairs(encoding_special_tokens("gpt2")));
  EXPECT_EQ(end_of_text_of("gpt2"), 50256);
  std::vector<int32_t> ids;
  encode_with_special(gpt2(), "a<|endoftext|><|endoftext|>", ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{64, 50256, 50256}));
  const auto byte = make_tokenizer("byte");
  EXPECT_FALSE(end_of_text_of("byte"));
  EXPECT_TRUE(byte->special_tokens().empty());
  ids.clear();
  encode_with_special(*byte, "<|endoftext|>", ids);
  EXPECT_EQ(ids.size(), 13u);
  // Invalid UTF-8 after a special token: the byte counts from the text's start.
  expect_error([&] { encode_with_special(gpt2(), "<|endoftext|>ab \xff", ids, "t.txt", 7); },
               "t.txt is not valid UTF-8 at byte 23");
}

// A ranks file that ranks a special token's id is not the encoding's.
TEST_F(TokenizerFiles, ARankAtASpecialIdIsRefused) {
  std::ostringstream lines;
  lines << byte_ranks();
  for (int r = 257; r <= 50256; ++r)  // three bytes each: none is "ab"
    lines << b64(std::string{static_cast<char>(r % 256), static_cast<char>(r / 256), 'x'}) << ' ' << r << '\n';
  const std::string file = write("clash.tiktoken", lines.str());
  expect_error([&] { (void)make_tokenizer("gpt2:" + file); },
               "clash.tiktoken: rank 50256 is the id of gpt2's special token <|endoftext|>");
  EXPECT_EQ(make_tokenizer("cl100k_base:" + file)->vocab_size(), 100277);
}

// `data text --eot` writes each encoding's end-of-text token after each file, and packing
// finds the documents by it from the recorded name alone (the ranks file may be gone).
TEST_F(TokenizerFiles, EndOfTextEndsEachFilesDocumentForEveryEncoding) {
  const std::string a = write("a.txt", "ab ab ab"), b = write("b.txt", "abab");
  for (const auto& [encoding, eot] : std::vector<std::pair<std::string, int32_t>>{{"cl100k_base", 100257},
                                                                                 {"o200k_base", 199999},
                                                                                 {"llama3", 128001}}) {
    SCOPED_TRACE(encoding);
    const std::string ranks = write(encoding + ".ranks", byte_ranks()), out = path(encoding + ".h5");
    const auto tok = make_tokenizer(encoding + ":" + ranks);
    const TokenFileInfo info = tokenize_text({a, b}, out, *tok, true);
    const std::vector<int32_t> expected = {256, ' ', 256, ' ', 256, eot, 256, 256, eot};
    ASSERT_EQ(info.num_tokens, static_cast<int64_t>(expected.size()));
    EXPECT_EQ(info.vocab_size, tok->vocab_size());
    const int vocab = static_cast<int>(tok->vocab_size());
    std::vector<int32_t> got(expected.size());
    TokenDataset({out}, 4, vocab).read_tokens(0, static_cast<int64_t>(got.size()), got.data());
    EXPECT_EQ(got, expected);
    fs::remove(ranks);
    const TokenDataset packed({out}, 8, vocab, false, true);
    ASSERT_NE(packed.packing(), nullptr);
    EXPECT_EQ(packed.packing()->documents(), 2);
  }
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
