// Byte-level BPE tokenizers (the Tokenizer of pipetrain/io/tokenizer.hpp): GPT-2's from
// OpenAI's encoder.json (GPT-2's byte-to-unicode strings -> ids) checked against its
// vocab.bpe (the merges, in rank order), or a tiktoken ranks file.
#pragma once
#include <memory>
#include <string>

#include "pipetrain/io/tokenizer.hpp"

namespace pipetrain {

// name() "gpt2"; vocabulary 50257, <|endoftext|> = 50256.
std::unique_ptr<Tokenizer> make_gpt2_bpe(const std::string& encoder_json, const std::string& vocab_bpe);
// name() the path; vocabulary max rank + 1; no end-of-text token.
std::unique_ptr<Tokenizer> make_tiktoken_bpe(const std::string& path);

}  // namespace pipetrain
