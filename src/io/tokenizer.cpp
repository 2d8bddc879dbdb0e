// The byte tokenizer, make_tokenizer, end_of_text_of, bundled_tokenizers_dir and stream_split (see
// pipetrain/io/tokenizer.hpp); byte-level BPE is in tokenizer_bpe.cpp.
#include "pipetrain/io/tokenizer.hpp"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "pipetrain/core/error.hpp"
#include "pipetrain/io/tokenizer_bpe.hpp"
#include "pipetrain/io/tokenizer_special.hpp"

namespace pipetrain {
namespace {

class ByteTokenizer : public Tokenizer {
 public:
  std::string name() const override { return "byte"; }
  int64_t vocab_size() const override { return 256; }
  void encode(std::string_view text, std::vector<int32_t>& out, std::string_view, int64_t) const override {
    for (unsigned char c : text) out.push_back(c);
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::string s;
    s.reserve(ids.size());
    for (int32_t id : ids) {
      if (id < 0 || id > 255) fail("byte tokenizer: id {} is not a byte", id);
      s.push_back(static_cast<char>(id));
    }
    return s;
  }
  std::optional<int32_t> end_of_text() const override { return std::nullopt; }
  std::optional<int64_t> count_for(int64_t bytes) const override { return bytes; }
};

bool is_ascii_non_space(char c) {
  const auto u = static_cast<unsigned char>(c);
  return u > 0x20 && u < 0x7f;
}

}  // namespace

std::string bundled_tokenizers_dir() {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("PIPETRAIN_TOKENIZERS"); env && *env) return env;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path installed = exe.parent_path().parent_path() / "share/pipetrain/inputs/tokenizers";
    if (fs::is_directory(installed, ec)) return installed.string();
  }
#ifdef PIPETRAIN_SOURCE_TOKENIZERS
  return PIPETRAIN_SOURCE_TOKENIZERS;
#else
  fail("no bundled tokenizers found: set PIPETRAIN_TOKENIZERS to the inputs/tokenizers directory");
#endif
}

namespace {

// What a spec names: the encoding ("byte", "gpt2" or a pattern's name) and its ranks file
// (none for byte and the bundled gpt2).
struct TokenizerSpec {
  std::string encoding;
  std::optional<std::string> ranks_file;
};

// A ranks file with the pattern that splits text for it: "NAME:PATH", or a file named
// after its encoding (cl100k_base.tiktoken). Any other pattern than the vocabulary's own
// gives wrong ids without an error, so a file of unknown pattern is refused.
TokenizerSpec parse_spec(const std::string& spec) {
  if (spec == "byte" || spec == "gpt2") return {spec, std::nullopt};
  const std::string names = fmt::format("{}", fmt::join(pretokenizer_names(), ", "));
  if (const auto colon = spec.find(':'); colon != std::string::npos && colon > 0 &&
                                         spec.find('/') > colon) {  // "NAME:PATH", not a path with a colon
    const std::string name = spec.substr(0, colon);
    if (!known_pretokenizer(name))
      fail("tokenizer '{}': no pre-tokenizer pattern is called '{}' (PATTERN:RANKS_FILE with PATTERN one of {})",
           spec, name, names);
    return {name, spec.substr(colon + 1)};
  }
  if (spec.size() > 9 && spec.ends_with(".tiktoken")) {
    const std::string stem = std::filesystem::path(spec).stem().string();
    if (known_pretokenizer(stem)) return {stem, spec};
    fail("tokenizer {}: which pre-tokenizer pattern splits text for this vocabulary? Name it before the path, "
         "e.g. cl100k_base:{} (patterns: {})",
         spec, spec, names);
  }
  fail("tokenizer '{}': expected byte, gpt2, or PATTERN:RANKS_FILE with PATTERN one of {} (a .tiktoken file "
       "named after its encoding needs no PATTERN)",
       spec, names);
}

}  // namespace

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec) {
  const TokenizerSpec s = parse_spec(spec);
  if (s.encoding == "byte") return std::make_unique<ByteTokenizer>();
  if (!s.ranks_file) {
    const std::string dir = bundled_tokenizers_dir() + "/gpt2";
    return make_gpt2_bpe(dir + "/encoder.json", dir + "/vocab.bpe");
  }
  return make_tiktoken_bpe(*s.ranks_file, s.encoding);
}

std::optional<int32_t> end_of_text_of(const std::string& spec) {
  return encoding_end_of_text(parse_spec(spec).encoding);
}

size_t stream_split(std::string_view text) {
  for (size_t p = text.size() >= 2 ? text.size() - 2 : 0; p > 0; --p)
    if (text[p] == ' ' && is_ascii_non_space(text[p - 1]) && is_ascii_non_space(text[p + 1])) return p;
  return 0;
}

}  // namespace pipetrain
