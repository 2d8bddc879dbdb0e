// Byte-level BPE (see pipetrain/io/tokenizer_bpe.hpp and tokenizer.hpp): a vocabulary's
// pre-tokenizer pattern through PCRE2 (UTF mode, Unicode properties, JIT where the
// library has it), then each piece's bytes merged pairwise by rank.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <fstream>
#include <limits>
#include <queue>
#include <tuple>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "pipetrain/core/error.hpp"
#include "pipetrain/io/tokenizer_bpe.hpp"
#include "pipetrain/io/tokenizer_special.hpp"

namespace pipetrain {
namespace {

// The pre-tokenizer patterns, as tiktoken (openai_public.py) and Meta's Llama 3 tokenizer
// write them. Whitespace is Unicode's White_Space, as in tiktoken's regex: PCRE2's \s plus
// NEL (U+0085), which some PCRE2 versions leave out, so \s reads [\s\x{85}] throughout.
//
// GPT-2 (r50k_base, p50k_base too): contractions, an optional space and letters, an
// optional space and digits, an optional space and other symbols, whitespace not followed
// by a non-space (so a run's last space joins the next word), any other whitespace.
constexpr const char* kGpt2Pattern =
    R"('(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\x{85}\p{L}\p{N}]+|[\s\x{85}]+(?![^\s\x{85}])|[\s\x{85}]+)";
// cl100k_base and Llama 3: case-blind contractions, letters after at most one non-letter,
// non-digit, non-newline character, digits in runs of at most three, symbols with their
// trailing newlines, newline runs with the whitespace before them, then whitespace as GPT-2.
constexpr const char* kCl100kPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\x{85}\p{L}\p{N}]+[\r\n]*)"
    R"(|[\s\x{85}]*[\r\n]+|[\s\x{85}]+(?![^\s\x{85}])|[\s\x{85}]+)";
// o200k_base: words split at case changes (an upper-case run, then lower-case letters,
// marks included), contractions kept with their word, digits in runs of at most three,
// symbols with their trailing newlines or slashes, then whitespace as cl100k_base.
constexpr const char* kO200kPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3}| ?[^\s\x{85}\p{L}\p{N}]+[\r\n/]*|[\s\x{85}]*[\r\n]+|[\s\x{85}]+(?![^\s\x{85}])|[\s\x{85}]+)";

struct NamedPattern {
  const char* name;
  const char* pattern;
};
constexpr NamedPattern kPatterns[] = {{"gpt2", kGpt2Pattern},           {"r50k_base", kGpt2Pattern},
                                      {"p50k_base", kGpt2Pattern},      {"cl100k_base", kCl100kPattern},
                                      {"o200k_base", kO200kPattern},    {"llama3", kCl100kPattern}};
constexpr int32_t kNoRank = std::numeric_limits<int32_t>::max();
constexpr size_t kLongPiece = 256;  // bytes: longer pieces merge through a heap

// Lets the maps be searched with string_views of the text (no copy per lookup).
struct BytesHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using Ranks = std::unordered_map<std::string, int32_t, BytesHash, std::equal_to<>>;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open", path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xc0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3f)));
  } else {
    out.push_back(static_cast<char>(0xe0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3f)));
  }
}

// GPT-2's reversible byte -> printable-character map (its files spell bytes this way):
// printable Latin-1 bytes map to themselves, the others to U+0100 onwards in order.
struct ByteUnicode {
  std::array<std::string, 256> spelling;           // byte -> its character, UTF-8
  std::unordered_map<std::string, uint8_t> byte;   // and back
  ByteUnicode() {
    auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff); };
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      std::string s;
      append_utf8(s, static_cast<char32_t>(printable(b) ? b : next++));
      spelling[static_cast<size_t>(b)] = s;
      byte[s] = static_cast<uint8_t>(b);
    }
  }
  // The bytes a GPT-2 file's token string stands for.
  std::string bytes_of(const std::string& spelled, const std::string& file) const {
    std::string out;
    for (size_t i = 0; i < spelled.size();) {
      const auto lead = static_cast<unsigned char>(spelled[i]);
      const size_t len = lead < 0x80 ? 1 : lead < 0xe0 ? 2 : 3;
      const auto it = byte.find(spelled.substr(i, len));
      if (it == byte.end()) fail("{}: token '{}' is not spelled in GPT-2's byte characters", file, spelled);
      out.push_back(static_cast<char>(it->second));
      i += len;
    }
    return out;
  }
};

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

std::optional<std::string> base64_decode(std::string_view s) {
  std::string out;
  int bits = 0, acc = 0;
  for (char c : s) {
    if (c == '=') break;
    const int v = base64_value(c);
    if (v < 0) return std::nullopt;
    acc = (acc << 6) | v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  return out;
}

// The compiled pre-tokenizer pattern.
class Pattern {
 public:
  explicit Pattern(const char* pattern) {
    int err = 0;
    PCRE2_SIZE at = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                          &err, &at, nullptr);
    if (!code_) fail("tokenizer: PCRE2 rejects the pre-tokenizer pattern at {} ({})", at, message(err));
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
    match_ = pcre2_match_data_create_from_pattern(code_, nullptr);
  }
  ~Pattern() {
    pcre2_match_data_free(match_);
    pcre2_code_free(code_);
  }
  Pattern(const Pattern&) = delete;
  Pattern& operator=(const Pattern&) = delete;

  // Calls piece(begin, end) for each piece of `text`, in order.
  template <typename F>
  void split(std::string_view text, std::string_view where, int64_t offset, F&& piece) const {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    uint32_t options = 0;  // the first match checks the whole subject is UTF-8, later ones need not
    for (size_t at = 0; at < text.size();) {
      const int rc = jit_ && options ? pcre2_jit_match(code_, subject, text.size(), at, options, match_, nullptr)
                                     : pcre2_match(code_, subject, text.size(), at, options, match_, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) fail("tokenizer: no piece of the pattern matches {} at byte {}", where, offset + at);
      if (rc < 0) {
        if (rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21)
          fail("{} is not valid UTF-8 at byte {} ({})", where, offset + static_cast<int64_t>(pcre2_get_startchar(match_)),
               message(rc));
        fail("tokenizer: matching {} failed at byte {} ({})", where, offset + at, message(rc));
      }
      options = PCRE2_NO_UTF_CHECK;
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match_);
      if (ov[0] != at)
        fail("tokenizer: {} has bytes {}..{} that no piece of the pattern covers", where, offset + at, offset + ov[0]);
      if (ov[1] == ov[0]) fail("tokenizer: empty piece in {} at byte {}", where, offset + at);
      piece(ov[0], ov[1]);
      at = ov[1];
    }
  }

 private:
  static std::string message(int code) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(code, buf, sizeof buf);
    return reinterpret_cast<const char*>(buf);
  }
  pcre2_code* code_ = nullptr;
  pcre2_match_data* match_ = nullptr;
  bool jit_ = false;
};

class BpeTokenizer : public Tokenizer {
 public:
  // `specials`: the encoding's special tokens (`encoding` names it in errors), `eot` one of them.
  BpeTokenizer(std::string name, Ranks ranks, std::vector<SpecialToken> specials, std::optional<int32_t> eot,
               const std::string& file, std::string_view encoding, const char* pattern)
      : name_(std::move(name)), ranks_(std::move(ranks)), specials_(std::move(specials)), eot_(eot), pattern_(pattern) {
    int32_t top = -1;
    for (const auto& [bytes, r] : ranks_) {
      if (r < 0) fail("{}: negative rank {}", file, r);
      top = std::max(top, r);
    }
    for (const SpecialToken& s : specials_) top = std::max(top, s.id);
    vocab_ = top + 1;
    pieces_.resize(static_cast<size_t>(vocab_));
    place_ranks(file);
    place_specials(file, encoding);
  }

  std::string name() const override { return name_; }
  int64_t vocab_size() const override { return vocab_; }
  std::optional<int32_t> end_of_text() const override { return eot_; }
  std::span<const SpecialToken> special_tokens() const override { return specials_; }

  void encode(std::string_view text, std::vector<int32_t>& out, std::string_view where, int64_t offset) const override {
    pattern_.split(text, where, offset, [&](size_t b, size_t e) { encode_piece(text.substr(b, e - b), out); });
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::string s;
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab_) fail("{} tokenizer: id {} is outside the vocabulary of {}", name_, id, vocab_);
      s += pieces_[static_cast<size_t>(id)];
    }
    return s;
  }

 private:
  void place_ranks(const std::string& file) {
    std::vector<bool> seen(static_cast<size_t>(vocab_), false);
    for (const auto& [bytes, r] : ranks_) {
      if (seen[static_cast<size_t>(r)]) fail("{}: rank {} is given twice", file, r);
      seen[static_cast<size_t>(r)] = true;
      pieces_[static_cast<size_t>(r)] = bytes;
    }
    for (int b = 0; b < 256; ++b)
      if (!ranks_.count(std::string(1, static_cast<char>(b))))
        fail("{}: byte {} has no rank (a byte-level vocabulary needs all 256)", file, b);
  }

  // A special token's id is no rank's: a ranks file that gives it one is not the encoding's.
  void place_specials(const std::string& file, std::string_view encoding) {
    for (const SpecialToken& s : specials_) {
      if (!pieces_[static_cast<size_t>(s.id)].empty())
        fail("{}: rank {} is the id of {}'s special token {}: not a {} ranks file", file, s.id, encoding, s.text,
             encoding);
      pieces_[static_cast<size_t>(s.id)] = s.text;
    }
  }

  int32_t rank(std::string_view bytes) const {
    const auto it = ranks_.find(bytes);
    return it == ranks_.end() ? kNoRank : it->second;
  }

  // Merges the piece's bytes: repeatedly joins the adjacent pair whose joined bytes have
  // the lowest rank (the leftmost of equals) until no adjacent pair has a rank.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
    if (const int32_t whole = rank(piece); whole != kNoRank) {
      out.push_back(whole);
      return;
    }
    if (auto it = cache_.find(piece); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
    std::vector<int32_t> ids = piece.size() > kLongPiece ? merge_long(piece) : merge_short(piece);
    out.insert(out.end(), ids.begin(), ids.end());
    if (cache_.size() > (1u << 20)) cache_.clear();  // bounded memory on any corpus
    cache_.emplace(std::string(piece), std::move(ids));
  }

  // Pieces up to kLongPiece bytes: scan the adjacent pairs for the lowest rank each round.
  std::vector<int32_t> merge_short(std::string_view piece) const {
    // starts[i]: where part i begins; joined[i]: the rank of parts i and i+1 joined.
    std::vector<size_t> starts(piece.size() + 1);
    for (size_t i = 0; i <= piece.size(); ++i) starts[i] = i;
    auto joined_rank = [&](size_t i) {
      return i + 2 < starts.size() ? rank(piece.substr(starts[i], starts[i + 2] - starts[i])) : kNoRank;
    };
    std::vector<int32_t> joined(starts.size());
    for (size_t i = 0; i < starts.size(); ++i) joined[i] = joined_rank(i);
    for (;;) {
      size_t best = 0;
      int32_t best_rank = kNoRank;
      for (size_t i = 0; i + 2 < starts.size(); ++i)
        if (joined[i] < best_rank) best_rank = joined[i], best = i;
      if (best_rank == kNoRank) break;
      starts.erase(starts.begin() + static_cast<std::ptrdiff_t>(best) + 1);
      joined.erase(joined.begin() + static_cast<std::ptrdiff_t>(best) + 1);
      joined[best] = joined_rank(best);
      if (best > 0) joined[best - 1] = joined_rank(best - 1);
    }
    std::vector<int32_t> ids;
    for (size_t i = 0; i + 1 < starts.size(); ++i) ids.push_back(rank(piece.substr(starts[i], starts[i + 1] - starts[i])));
    return ids;
  }

  // Longer pieces (a run of letters without spaces: CJK text) in O(n log n): the parts as a
  // linked list, candidate pairs in a heap by (rank, start) — the same lowest rank, leftmost
  // first, as the scan — and entries whose parts have changed since skipped when popped.
  std::vector<int32_t> merge_long(std::string_view piece) const {
    const size_t n = piece.size();
    std::vector<size_t> next(n), prev(n), end(n);  // part starting at i: [i, end[i]); links by start
    std::vector<bool> alive(n, true);
    for (size_t i = 0; i < n; ++i) next[i] = i + 1, prev[i] = i - 1, end[i] = i + 1;
    using Entry = std::tuple<int32_t, size_t, size_t, size_t>;  // rank, left start, right start, right end
    std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
    auto push = [&](size_t left) {
      if (left >= n || end[left] >= n) return;
      const size_t right = end[left];
      const int32_t r = rank(piece.substr(left, end[right] - left));
      if (r != kNoRank) heap.emplace(r, left, right, end[right]);
    };
    for (size_t i = 0; i + 1 < n; ++i) push(i);
    while (!heap.empty()) {
      const auto [r, left, right, right_end] = heap.top();
      heap.pop();
      if (!alive[left] || end[left] != right || !alive[right] || end[right] != right_end) continue;  // stale
      alive[right] = false;  // join right into left
      end[left] = end[right];
      next[left] = next[right];
      if (next[left] < n) prev[next[left]] = left;
      if (left > 0) push(prev[left]);
      push(left);
    }
    std::vector<int32_t> ids;
    for (size_t i = 0; i < n; i = end[i]) ids.push_back(rank(piece.substr(i, end[i] - i)));
    return ids;
  }

  std::string name_;
  Ranks ranks_;  // a token's bytes -> its id
  std::vector<std::string> pieces_;                 // id -> bytes (a special token's: its text)
  std::vector<SpecialToken> specials_;
  std::optional<int32_t> eot_;
  int64_t vocab_ = 0;
  Pattern pattern_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, BytesHash, std::equal_to<>> cache_;  // pieces seen (encode is not thread-safe)
};

}  // namespace

std::unique_ptr<Tokenizer> make_gpt2_bpe(const std::string& encoder_json, const std::string& vocab_bpe) {
  static const ByteUnicode bu;
  nlohmann::json enc;
  try {
    enc = nlohmann::json::parse(read_file(encoder_json));
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON ({})", encoder_json, e.what());
  }
  if (!enc.is_object()) fail("{}: expected an object of token -> id", encoder_json);
  Ranks ranks;
  std::optional<int32_t> eot;
  for (const auto& [spelled, id] : enc.items()) {
    if (!id.is_number_integer()) fail("{}: the id of '{}' is not an integer", encoder_json, spelled);
    if (spelled == "<|endoftext|>") {
      eot = id.get<int32_t>();
      continue;
    }
    ranks[bu.bytes_of(spelled, encoder_json)] = id.get<int32_t>();
  }
  if (!eot) fail("{}: no <|endoftext|> token", encoder_json);
  if (eot != encoding_end_of_text("gpt2"))
    fail("{}: <|endoftext|> is {}, GPT-2's is {}", encoder_json, *eot, *encoding_end_of_text("gpt2"));
  // The merges must name, in order, the tokens ranked 256, 257, ...: the ranks are then
  // what BPE with these merges produces (tiktoken checks the same).
  std::istringstream merges(read_file(vocab_bpe));
  std::string line;
  int32_t expect = 256;
  int line_no = 0;
  while (std::getline(merges, line)) {
    ++line_no;
    if (line.empty() || line.starts_with("#version")) continue;
    const auto sp = line.find(' ');
    if (sp == std::string::npos) fail("{}:{}: expected two tokens separated by a space", vocab_bpe, line_no);
    const std::string joined = bu.bytes_of(line.substr(0, sp), vocab_bpe) + bu.bytes_of(line.substr(sp + 1), vocab_bpe);
    const auto it = ranks.find(joined);
    if (it == ranks.end() || it->second != expect)
      fail("{}:{}: merge '{}' gives rank {} in {}, expected {}", vocab_bpe, line_no, line,
           it == ranks.end() ? -1 : it->second, encoder_json, expect);
    ++expect;
  }
  if (expect != static_cast<int32_t>(ranks.size()))
    fail("{}: {} merges for {} tokens of {} (expected {})", vocab_bpe, expect - 256, ranks.size(), encoder_json,
         ranks.size() - 256);
  return std::make_unique<BpeTokenizer>("gpt2", std::move(ranks), encoding_special_tokens("gpt2"), eot, encoder_json,
                                        "gpt2", kGpt2Pattern);
}

std::vector<std::string> pretokenizer_names() {
  std::vector<std::string> names;
  for (const auto& p : kPatterns) names.emplace_back(p.name);
  return names;
}

bool known_pretokenizer(std::string_view name) {
  for (const auto& p : kPatterns)
    if (name == p.name) return true;
  return false;
}

std::unique_ptr<Tokenizer> make_tiktoken_bpe(const std::string& path, const std::string& pattern_name) {
  const char* pattern = nullptr;
  for (const auto& p : kPatterns)
    if (pattern_name == p.name) pattern = p.pattern;
  if (!pattern) fail("tokenizer {}: no pre-tokenizer pattern is called '{}'", path, pattern_name);
  std::istringstream in(read_file(path));
  Ranks ranks;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty()) continue;
    const auto sp = line.find(' ');
    const auto bytes = sp == std::string::npos ? std::nullopt : base64_decode(std::string_view(line).substr(0, sp));
    long long r = -1;
    try {
      if (bytes) r = std::stoll(line.substr(sp + 1));
    } catch (const std::exception&) {
      r = -1;
    }
    if (!bytes || bytes->empty() || r < 0 || r >= kNoRank)
      fail("{}:{}: expected \"base64(bytes) rank\"", path, line_no);
    if (!ranks.emplace(*bytes, static_cast<int32_t>(r)).second) fail("{}:{}: these bytes are ranked twice", path, line_no);
  }
  if (ranks.empty()) fail("{}: no ranks", path);
  // The vocabulary is the largest rank + 1: ranks are 0 .. n-1 (a few gaps at most).
  int32_t top = 0;
  for (const auto& [bytes, r] : ranks) top = std::max(top, r);
  if (static_cast<size_t>(top) >= 2 * ranks.size() + 1024)
    fail("{}: rank {} with only {} entries (ranks run from 0 to the entry count)", path, top, ranks.size());
  return std::make_unique<BpeTokenizer>(pattern_name + ":" + path, std::move(ranks), encoding_special_tokens(pattern_name),
                                        encoding_end_of_text(pattern_name), path, pattern_name, pattern);
}

}  // namespace pipetrain
