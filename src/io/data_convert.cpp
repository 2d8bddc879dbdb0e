// convert_text, convert_llmc, convert_raw (see pipetrain/io/data_convert.hpp): check
// every input first (existence, headers, sizes), then stream them block by block into
// one TokenFileWriter, so memory stays bounded for inputs of any size.
#include "pipetrain/io/data_convert.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "pipetrain/core/error.hpp"

namespace pipetrain {
namespace {

constexpr int64_t kBlockTokens = int64_t{1} << 20;
constexpr int64_t kLlmcHeaderBytes = kLlmcHeaderInts * 4;

// Size of an input file; throws naming it if it is missing or not a regular file.
int64_t input_size(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) fail("{}: no such file", path);
  if (fs::is_directory(path, ec)) fail("{}: is a directory", path);
  const auto size = fs::file_size(path, ec);
  if (ec) fail("{}: cannot read its size ({})", path, ec.message());
  return static_cast<int64_t>(size);
}

// An input file open for sequential reading.
class Input {
 public:
  explicit Input(const std::string& path) : path_(path), f_(std::fopen(path.c_str(), "rb")) {
    if (!f_) fail("{}: cannot open ({})", path, std::strerror(errno));
  }
  ~Input() { std::fclose(f_); }
  Input(const Input&) = delete;
  Input& operator=(const Input&) = delete;

  // Reads exactly n bytes or throws naming the file.
  void read(unsigned char* buf, size_t n) {
    if (std::fread(buf, 1, n, f_) != n)
      fail("{}: read failed ({})", path_,
           std::ferror(f_) ? std::strerror(errno) : "file shorter than expected");
  }

 private:
  std::string path_;
  std::FILE* f_;
};

uint32_t load_le(const unsigned char* p, int width) {
  uint32_t v = 0;
  for (int b = width - 1; b >= 0; --b) v = (v << 8) | p[b];
  return v;
}

// Streams `count` little-endian tokens of `width` bytes from `in` into `w`, checking
// each against `vocab` (`vocab_what` says where that limit comes from).
void stream_tokens(Input& in, const std::string& path, int64_t count, int width, int64_t vocab,
                   const std::string& vocab_what, TokenFileWriter& w) {
  std::vector<unsigned char> bytes(static_cast<size_t>(std::min(count, kBlockTokens) * width));
  std::vector<uint32_t> tokens(static_cast<size_t>(std::min(count, kBlockTokens)));
  for (int64_t done = 0; done < count;) {
    const int64_t n = std::min(count - done, kBlockTokens);
    in.read(bytes.data(), static_cast<size_t>(n * width));
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t v = load_le(&bytes[static_cast<size_t>(i * width)], width);
      if (v >= vocab) fail("{}: token {} at index {} is >= {}", path, v, done + i, vocab_what);
      tokens[static_cast<size_t>(i)] = v;
    }
    w.append(std::span<const uint32_t>(tokens.data(), static_cast<size_t>(n)));
    done += n;
  }
}

void require_inputs(const std::vector<std::string>& inputs) {
  if (inputs.empty()) fail("no input files given");
}

// Checks an llm.c shard's header and size; returns its token count.
int64_t check_llmc_shard(const std::string& path) {
  const int64_t size = input_size(path);
  if (size < kLlmcHeaderBytes)
    fail("{}: truncated llm.c shard ({} bytes; the header alone is {})", path, size,
         kLlmcHeaderBytes);
  unsigned char header[kLlmcHeaderBytes];
  Input(path).read(header, sizeof header);
  const auto magic = static_cast<int32_t>(load_le(header, 4));
  const auto version = static_cast<int32_t>(load_le(header + 4, 4));
  const auto count = static_cast<int32_t>(load_le(header + 8, 4));
  if (magic != kLlmcMagic)
    fail("{}: bad magic {} (an llm.c token shard starts with {})", path, magic, kLlmcMagic);
  if (version != kLlmcVersion)
    fail("{}: unsupported llm.c shard version {} (only version {}: GPT-2, uint16 tokens)", path,
         version, kLlmcVersion);
  if (count < 0) fail("{}: bad token count {} in the header", path, count);
  const int64_t expected = kLlmcHeaderBytes + 2 * int64_t{count};
  if (size < expected)
    fail("{}: truncated: the header says {} tokens ({} bytes), the file has {} bytes", path, count,
         expected, size);
  if (size > expected)
    fail("{}: {} unexpected bytes after the {} tokens the header announces", path, size - expected,
         count);
  return count;
}

}  // namespace

TokenFileInfo convert_text(const std::vector<std::string>& inputs, const std::string& out) {
  require_inputs(inputs);
  std::vector<int64_t> sizes;
  int64_t total = 0;
  for (const auto& path : inputs) total += sizes.emplace_back(input_size(path));
  TokenFileWriter w(out, total, 256, "byte");
  for (size_t i = 0; i < inputs.size(); ++i) {
    Input in(inputs[i]);
    stream_tokens(in, inputs[i], sizes[i], 1, 256, "256", w);
  }
  return w.commit();
}

TokenFileInfo convert_llmc(const std::vector<std::string>& shards, const std::string& out) {
  require_inputs(shards);
  std::vector<int64_t> counts;
  int64_t total = 0;
  for (const auto& path : shards) total += counts.emplace_back(check_llmc_shard(path));
  TokenFileWriter w(out, total, kGpt2Vocab, "gpt2");
  unsigned char header[kLlmcHeaderBytes];
  for (size_t i = 0; i < shards.size(); ++i) {
    Input in(shards[i]);
    in.read(header, sizeof header);
    stream_tokens(in, shards[i], counts[i], 2, kGpt2Vocab,
                  fmt::format("the GPT-2 vocab_size {}", kGpt2Vocab), w);
  }
  return w.commit();
}

TokenFileInfo convert_raw(const std::vector<std::string>& inputs, const std::string& out,
                          const std::string& dtype, int64_t vocab_size,
                          const std::string& tokenizer) {
  require_inputs(inputs);
  int width = 0;
  if (dtype == "u16" || dtype == "uint16")
    width = 2;
  else if (dtype == "u32" || dtype == "uint32")
    width = 4;
  else
    fail("--dtype must be u16 or u32, got '{}'", dtype);
  const int64_t max_vocab = int64_t{1} << (8 * width);
  if (vocab_size < 1 || vocab_size > max_vocab)
    fail("--vocab {} out of range for {} tokens (1 .. {})", vocab_size, dtype, max_vocab);
  std::vector<int64_t> counts;
  int64_t total = 0;
  for (const auto& path : inputs) {
    const int64_t size = input_size(path);
    if (size % width != 0)
      fail("{}: {} bytes is not a whole number of {}-byte tokens", path, size, width);
    total += counts.emplace_back(size / width);
  }
  TokenFileWriter w(out, total, vocab_size, tokenizer);
  for (size_t i = 0; i < inputs.size(); ++i) {
    Input in(inputs[i]);
    stream_tokens(in, inputs[i], counts[i], width, vocab_size,
                  fmt::format("--vocab {}", vocab_size), w);
  }
  return w.commit();
}

}  // namespace pipetrain
