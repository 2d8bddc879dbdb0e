// Fuzz target: the text-side readers of io — a Megatron index with its .bin
// (io/megatron_dataset.hpp), a tiktoken ranks file and GPT-2's BPE on arbitrary text
// (io/tokenizer.hpp). These are our own parsers of raw bytes, so the input is the bytes.
// Each must return or throw pipetrain::Error; a BPE tokenizer must give back the text it
// encoded (decode(encode(x)) == x) and reject text that is not UTF-8.
//
// Input layout: byte 0 % 3 picks the reader; the rest is
//   0: a Megatron .idx; the .bin holds the next (u16 % 4096) bytes of the input after
//      a 2-byte length, the index being everything after that;
//   1: a tiktoken ranks file (its first 256 lines are forced to the single bytes when
//      byte 1 is odd, so the merges behind them are exercised), then encode of a sample;
//   2: text for the GPT-2 tokenizer.
#include <cstddef>
#include <cstdio>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "fuzz_common.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/io/megatron_dataset.hpp"
#include "pipetrain/io/tokenizer.hpp"

namespace {

using namespace pipetrain_fuzz;

bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 0 : (c >> 5) == 0x6 ? 1 : (c >> 4) == 0xe ? 2 : (c >> 3) == 0x1e ? 3 : 9;
    if (n == 9 || i + n >= s.size() + (n == 0)) return false;
    for (size_t k = 1; k <= n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return false;
    const auto c1 = n ? static_cast<unsigned char>(s[i + 1]) : 0;
    if ((n == 1 && c < 0xc2) || (n == 2 && c == 0xe0 && c1 < 0xa0) || (n == 2 && c == 0xed && c1 >= 0xa0) ||
        (n == 3 && c == 0xf0 && c1 < 0x90) || (n == 3 && (c > 0xf4 || (c == 0xf4 && c1 >= 0x90))))
      return false;
    i += n + 1;
  }
  return true;
}

void check_round_trip(const pipetrain::Tokenizer& tok, const std::string& text) {
  std::vector<int32_t> ids;
  try {
    tok.encode(text, ids, "fuzz input");
  } catch (const pipetrain::Error&) {
    require(!valid_utf8(text), "BPE rejected valid UTF-8");
    return;
  }
  require(valid_utf8(text), "BPE accepted text that is not UTF-8");
  for (int32_t id : ids) require(id >= 0 && id < tok.vocab_size(), "an id outside the vocabulary");
  require(tok.decode(ids) == text, "decode(encode(x)) != x");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Bytes in(data, size);
  const int mode = in.u8() % 3;
  if (mode == 0) {
    const std::string prefix = temp_path("megatron");
    const size_t bin_size = in.u16() % 4096;
    std::ofstream(prefix + ".bin", std::ios::binary) << in.str(bin_size);
    std::ofstream(prefix + ".idx", std::ios::binary) << in.rest();
    try {
      const pipetrain::MegatronDataset ds(prefix);
      const auto& docs = ds.document_starts();
      require(!docs.empty() && docs.front() == 0 && docs.back() == ds.num_tokens(), "document starts out of range");
      for (size_t d = 1; d < docs.size(); ++d) require(docs[d - 1] <= docs[d], "document starts decrease");
      std::vector<int32_t> out(static_cast<size_t>(ds.num_tokens()));
      try {
        ds.read(0, ds.num_tokens(), out.data());
      } catch (const pipetrain::Error&) {
      }
    } catch (const pipetrain::Error& e) {
      note(e.what());
    }
    std::remove((prefix + ".bin").c_str());
    std::remove((prefix + ".idx").c_str());
  } else if (mode == 1) {
    const bool with_bytes = in.u8() & 1;
    std::string text;
    if (with_bytes) {
      static const char* digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
      for (int b = 0; b < 256; ++b) {
        text += digits[b >> 2];
        text += digits[(b & 3) << 4];
        text += "== " + std::to_string(b) + "\n";
      }
    }
    text += in.rest();
    const std::string path = temp_path("ranks") + ".tiktoken";
    std::ofstream(path, std::ios::binary) << text;
    try {
      // Each pre-tokenizer pattern in turn, chosen by the file's length.
      static const char* patterns[] = {"gpt2:", "cl100k_base:", "o200k_base:", "llama3:"};
      const auto tok = pipetrain::make_tokenizer(patterns[text.size() % 4] + path);
      check_round_trip(*tok, "hello world, it's 2026! caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac");
    } catch (const pipetrain::Error& e) {
      note(e.what());
    }
    std::remove(path.c_str());
  } else {
    static const auto gpt2 = pipetrain::make_tokenizer("gpt2");
    check_round_trip(*gpt2, in.rest());
  }
  return 0;
}
