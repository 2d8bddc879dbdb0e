// Special tokens (pipetrain/io/tokenizer_special.hpp) and encode_with_special
// (pipetrain/io/tokenizer.hpp).
#include "pipetrain/io/tokenizer_special.hpp"

#include <fmt/format.h>

namespace pipetrain {
namespace {

// Meta's Llama 3 tokenizer.py (meta-llama/llama3, llama/tokenizer.py): ten named tokens,
// then reserved ones up to 256, numbered after the 128 000 ranks of its tokenizer.model.
std::vector<SpecialToken> llama3_special_tokens() {
  std::vector<std::string> texts = {"<|begin_of_text|>",
                                    "<|end_of_text|>",
                                    "<|reserved_special_token_0|>",
                                    "<|reserved_special_token_1|>",
                                    "<|reserved_special_token_2|>",
                                    "<|reserved_special_token_3|>",
                                    "<|start_header_id|>",
                                    "<|end_header_id|>",
                                    "<|reserved_special_token_4|>",
                                    "<|eot_id|>"};
  constexpr int kReserved = 256;
  for (int i = 5; i < kReserved - 5; ++i) texts.push_back(fmt::format("<|reserved_special_token_{}|>", i));
  constexpr int32_t kBaseTokens = 128000;
  std::vector<SpecialToken> tokens;
  for (size_t i = 0; i < texts.size(); ++i) tokens.push_back({texts[i], kBaseTokens + static_cast<int32_t>(i)});
  return tokens;
}

// The special token whose text starts at text[at] (the longest where several would).
const SpecialToken* special_at(std::span<const SpecialToken> specials, std::string_view text, size_t at) {
  const SpecialToken* found = nullptr;
  for (const SpecialToken& s : specials)
    if (text.substr(at).starts_with(s.text) && (!found || s.text.size() > found->text.size())) found = &s;
  return found;
}

}  // namespace

std::vector<SpecialToken> encoding_special_tokens(std::string_view encoding) {
  if (encoding == "gpt2" || encoding == "r50k_base" || encoding == "p50k_base") return {{"<|endoftext|>", 50256}};
  if (encoding == "cl100k_base")
    return {{"<|endoftext|>", 100257},
            {"<|fim_prefix|>", 100258},
            {"<|fim_middle|>", 100259},
            {"<|fim_suffix|>", 100260},
            {"<|endofprompt|>", 100276}};
  if (encoding == "o200k_base") return {{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}};
  if (encoding == "llama3") return llama3_special_tokens();
  return {};
}

std::optional<int32_t> encoding_end_of_text(std::string_view encoding) {
  const std::string_view text = encoding == "llama3" ? "<|end_of_text|>" : "<|endoftext|>";
  for (const SpecialToken& s : encoding_special_tokens(encoding))
    if (s.text == text) return s.id;
  return std::nullopt;
}

void encode_with_special(const Tokenizer& tok, std::string_view text, std::vector<int32_t>& out,
                         std::string_view where, int64_t offset) {
  const std::span<const SpecialToken> specials = tok.special_tokens();
  std::string first_bytes;  // where a special token may start
  for (const SpecialToken& s : specials)
    if (!s.text.empty() && first_bytes.find(s.text[0]) == std::string::npos) first_bytes.push_back(s.text[0]);
  size_t done = 0;  // the text before it is encoded
  for (size_t at = text.find_first_of(first_bytes); at < text.size(); at = text.find_first_of(first_bytes, at)) {
    const SpecialToken* s = special_at(specials, text, at);
    if (!s) {
      ++at;
      continue;
    }
    tok.encode(text.substr(done, at - done), out, where, offset + static_cast<int64_t>(done));
    out.push_back(s->id);
    at = done = at + s->text.size();
  }
  tok.encode(text.substr(done), out, where, offset + static_cast<int64_t>(done));
}

}  // namespace pipetrain
