// Byte-level BPE tokenizers (the Tokenizer of pipetrain/io/tokenizer.hpp): GPT-2's from
// OpenAI's encoder.json (GPT-2's byte-to-unicode strings -> ids) checked against its
// vocab.bpe (the merges, in rank order), or a tiktoken ranks file split by a named
// pre-tokenizer pattern.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "pipetrain/io/tokenizer.hpp"

namespace pipetrain {

// name() "gpt2"; vocabulary 50257, <|endoftext|> = 50256 (encoder.json's, checked).
std::unique_ptr<Tokenizer> make_gpt2_bpe(const std::string& encoder_json, const std::string& vocab_bpe);
// The pre-tokenizer patterns by name: gpt2 (also r50k_base, p50k_base), cl100k_base,
// o200k_base, llama3 (Meta's Llama 3, cl100k_base's pattern).
std::vector<std::string> pretokenizer_names();
bool known_pretokenizer(std::string_view name);
// name() "PATTERN:path"; the pattern's name is the encoding's, whose special tokens come
// with the ranks at their fixed ids (tokenizer_special.hpp: a rank at one is an error);
// vocabulary the largest rank or special id + 1.
std::unique_ptr<Tokenizer> make_tiktoken_bpe(const std::string& path, const std::string& pattern_name);

}  // namespace pipetrain
