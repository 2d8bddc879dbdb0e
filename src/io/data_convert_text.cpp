// tokenize_text (see pipetrain/io/data_convert.hpp): text files through a Tokenizer into
// one growing token file.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <cerrno>
#include <filesystem>

#include "pipetrain/core/error.hpp"
#include "pipetrain/io/data_convert.hpp"

namespace pipetrain {
namespace {

void append_tokens(TokenFileWriter& w, const std::vector<int32_t>& ids, std::vector<uint32_t>& scratch) {
  scratch.assign(ids.begin(), ids.end());
  w.append(std::span<const uint32_t>(scratch));
}

}  // namespace

TokenFileInfo tokenize_text(const std::vector<std::string>& inputs, const std::string& out, const Tokenizer& tok,
                            bool eot, const std::function<void(const TextProgress&)>& progress, size_t block_bytes) {
  if (inputs.empty()) fail("no input files given");
  if (eot && !tok.end_of_text()) fail("--eot: the {} tokenizer has no end-of-text token", tok.name());
  TextProgress p;
  for (const auto& path : inputs) {  // every input checked before anything is written
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) fail("{}: no such file", path);
    p.bytes_total += static_cast<int64_t>(std::filesystem::file_size(path, ec));
  }
  // A dataset of a known size when the tokenizer's count follows from the bytes; else one
  // that grows as the ids come.
  const std::optional<int64_t> known = tok.count_for(p.bytes_total);
  TokenFileWriter w(out, known ? *known : kTokensNotKnown, tok.vocab_size(), tok.name());
  std::vector<int32_t> ids;
  std::vector<uint32_t> scratch;
  std::string text, block(std::max<size_t>(block_bytes, 1), '\0');
  for (const auto& path : inputs) {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) fail("{}: cannot open ({})", path, std::strerror(errno));
    int64_t offset = 0;  // of `text` in the file
    auto encode = [&](size_t n) {
      ids.clear();
      tok.encode(std::string_view(text).substr(0, n), ids, path, offset);
      append_tokens(w, ids, scratch);
      p.tokens += static_cast<int64_t>(ids.size());
      text.erase(0, n);
      offset += static_cast<int64_t>(n);
    };
    try {
      for (;;) {
        const size_t got = std::fread(block.data(), 1, block.size(), f);
        if (got == 0) {
          if (std::ferror(f)) fail("{}: read failed ({})", path, std::strerror(errno));
          break;
        }
        text.append(block, 0, got);
        p.bytes_done += static_cast<int64_t>(got);
        if (const size_t cut = stream_split(text); cut > 0) encode(cut);
        if (progress) progress(p);
      }
      encode(text.size());
    } catch (...) {
      std::fclose(f);
      throw;
    }
    std::fclose(f);
    if (eot) {
      ids.assign(1, *tok.end_of_text());
      append_tokens(w, ids, scratch);
      ++p.tokens;
    }
  }
  if (progress) progress(p);
  return w.commit();
}

}  // namespace pipetrain
