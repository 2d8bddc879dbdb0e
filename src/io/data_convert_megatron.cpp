// convert_megatron (see pipetrain/io/data_convert.hpp): a Megatron indexed dataset's
// tokens, block by block from the mapped .bin, into one token file.
#include <algorithm>

#include "pipetrain/core/error.hpp"
#include "pipetrain/io/data_convert.hpp"

namespace pipetrain {

TokenFileInfo convert_megatron(const std::string& prefix, const std::string& out, int64_t vocab_size,
                               const std::string& tokenizer) {
  const MegatronDataset src(prefix);
  constexpr int64_t kBlock = int64_t{1} << 20;
  std::vector<int32_t> block(static_cast<size_t>(std::min(src.num_tokens(), kBlock)));
  if (vocab_size == 0) {  // one pass for the largest token (the .bin is mapped: cheap)
    int64_t top = -1;
    for (int64_t at = 0; at < src.num_tokens(); at += kBlock) {
      const int64_t n = std::min(kBlock, src.num_tokens() - at);
      src.read(at, n, block.data());
      for (int64_t i = 0; i < n; ++i) top = std::max<int64_t>(top, block[static_cast<size_t>(i)]);
    }
    vocab_size = std::max<int64_t>(top + 1, 1);
  }
  TokenFileWriter w(out, src.num_tokens(), vocab_size, tokenizer);
  std::vector<uint32_t> tokens(block.size());
  for (int64_t at = 0; at < src.num_tokens(); at += kBlock) {
    const int64_t n = std::min(kBlock, src.num_tokens() - at);
    src.read(at, n, block.data());
    std::copy(block.begin(), block.begin() + n, tokens.begin());
    w.append(std::span<const uint32_t>(tokens.data(), static_cast<size_t>(n)));
  }
  return w.commit();
}

}  // namespace pipetrain
