// The special tokens of each byte-level BPE encoding (tokenizer_bpe.hpp's pattern names),
// as tiktoken's openai_public.py and Meta's Llama 3 tokenizer.py define them, and which of
// them ends a document. encode_with_special (tokenizer.hpp) is implemented beside them.
#pragma once
#include <optional>
#include <string_view>
#include <vector>

#include "pipetrain/io/tokenizer.hpp"

namespace pipetrain {

// gpt2, r50k_base, p50k_base: <|endoftext|> 50256. cl100k_base: <|endoftext|> 100257,
// <|fim_prefix|> 100258, <|fim_middle|> 100259, <|fim_suffix|> 100260, <|endofprompt|>
// 100276. o200k_base: <|endoftext|> 199999, <|endofprompt|> 200018. llama3: Meta's 256 from
// 128000 (<|begin_of_text|>, <|end_of_text|>, <|reserved_special_token_0|>.., the chat
// headers' <|start_header_id|> 128006 and <|end_header_id|> 128007, <|eot_id|> 128009).
// Empty for any other name.
std::vector<SpecialToken> encoding_special_tokens(std::string_view encoding);

// The id of the encoding's end-of-text token: <|endoftext|>, Llama 3's <|end_of_text|>.
std::optional<int32_t> encoding_end_of_text(std::string_view encoding);

}  // namespace pipetrain
