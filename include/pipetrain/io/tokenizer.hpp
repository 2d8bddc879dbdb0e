// Text to token ids and back.
//
// Exports:
//   - SpecialToken, Tokenizer: the interface (encode ordinary text, decode ids, vocabulary,
//     the encoding's special tokens and its end-of-text token);
//   - make_tokenizer(spec): "byte" (each byte a token, vocabulary 256), "gpt2" (OpenAI's
//     GPT-2 byte-level BPE, the files bundled in inputs/tokenizers/gpt2, identical to
//     tiktoken's `gpt2` encoding), or "PATTERN:PATH" of a tiktoken ranks file (lines
//     "base64(bytes) rank") for another byte-level BPE vocabulary with its pre-tokenizer
//     pattern (tokenizer_bpe.hpp: gpt2, cl100k_base, o200k_base, llama3); a file named
//     after its encoding (cl100k_base.tiktoken) needs no PATTERN, any other is refused;
//     PATTERN names the encoding, whose special tokens come with it (tokenizer_special.hpp);
//   - encode_with_special(): encoding where a special token's text is its id, on request;
//   - end_of_text_of(spec): the end-of-text id a spec's tokenizer has, from its name;
//   - stream_split(): where a long text may be cut so that encoding the parts one after
//     the other gives the same ids as encoding it whole (how `data text` streams).
//
// Byte-level BPE (src/io/tokenizer_bpe.cpp): the text is cut into pieces by the
// vocabulary's pre-tokenizer pattern (contractions, letters, numbers, other symbols,
// whitespace; Unicode classes through PCRE2), and each piece's bytes are merged pairwise, lowest rank first,
// as tiktoken does. Text must be valid UTF-8 (the error says where it is not).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace pipetrain {

// A token no ordinary text encodes to (<|endoftext|>): its text and its id.
struct SpecialToken {
  std::string text;
  int32_t id = 0;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // What a dataset records in its `tokenizer` attribute; make_tokenizer(name()) makes it again.
  virtual std::string name() const = 0;
  virtual int64_t vocab_size() const = 0;  // every id is below it (special tokens included)
  // Appends the ids of `text`; special tokens' text is encoded as ordinary text.
  // `where` names the text in errors (a file, "the prompt"); `offset` is where `text`
  // starts in it (errors give byte positions in `where`).
  virtual void encode(std::string_view text, std::vector<int32_t>& out, std::string_view where = "the text",
                      int64_t offset = 0) const = 0;
  // The bytes the ids stand for (a prefix of a multi-byte character may be incomplete).
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // The document separator (<|endoftext|>; Llama 3's <|end_of_text|>), if the vocabulary has one.
  virtual std::optional<int32_t> end_of_text() const = 0;
  // The encoding's special tokens; decode() gives their text, encode() never their ids.
  virtual std::span<const SpecialToken> special_tokens() const { return {}; }
  // How many ids `bytes` bytes of text give, when that follows from the size alone.
  virtual std::optional<int64_t> count_for(int64_t) const { return std::nullopt; }
};

// Appends the ids of `text` with each special token's text taken as its id and the text
// between encoded as ordinary text (tiktoken's encode(text, allowed_special="all")): for a
// text that asks for them, never for a corpus, whose "<|endoftext|>" is prose.
void encode_with_special(const Tokenizer& tok, std::string_view text, std::vector<int32_t>& out,
                         std::string_view where = "the text", int64_t offset = 0);

// Throws pipetrain::Error naming the spec or the file (unknown name, missing or malformed
// vocabulary files).
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec);
// make_tokenizer(spec)->end_of_text() from the spec alone, without reading its files (the
// encoding decides it): how packing finds a dataset's documents by its `tokenizer` attribute.
std::optional<int32_t> end_of_text_of(const std::string& spec);

// The directory of the bundled vocabularies: $PIPETRAIN_TOKENIZERS, else the installed
// share/pipetrain/inputs/tokenizers beside the executable, else the source tree's.
std::string bundled_tokenizers_dir();

// A position p <= text.size() such that encode(text[0, p)) followed by encode(text[p, ...))
// equals encode(text) whatever follows: just before a space that sits between two
// non-space ASCII characters (no piece of the pattern spans it). 0 when the text has none.
size_t stream_split(std::string_view text);

}  // namespace pipetrain
