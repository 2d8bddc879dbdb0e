// Blends of token sources (io/data_blend.hpp): every prefix of the stream holds each
// source within one sample of its weight, sample n's source does not depend on which
// samples were asked for before (a resumed run continues the stream), the samples are the
// sources' own windows, and sources that disagree on the vocabulary are an error naming
// the file.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "pipetrain/io/data_blend.hpp"
#include "pipetrain/io/token_writer.hpp"
#include "test_files.hpp"

namespace pipetrain {
namespace {

class BlendFiles : public testing::TempDirTest {
 public:
  std::string file(const std::string& name, uint32_t base, int n, int64_t vocab = 256,
                   const std::string& tokenizer = "byte") {
    std::vector<uint32_t> v(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = (base + static_cast<uint32_t>(i)) % 250;
    write_token_file(path(name), v, vocab, tokenizer);
    return path(name);
  }
};

TEST_F(BlendFiles, EveryPrefixHoldsEachSourceWithinOneSampleOfItsWeight) {
  const std::vector<std::string> paths = {file("a.h5", 0, 400), file("b.h5", 100, 300), file("c.h5", 200, 200)};
  BlendedSampler blend(paths, {5, 3, 2}, 8, 256, false, "shuffle", 1);
  for (int64_t n = 1; n <= 5000; ++n) {
    const auto c = blend.counts(n);
    for (int k = 0; k < 3; ++k)
      ASSERT_LT(std::abs(static_cast<double>(c[static_cast<size_t>(k)]) - blend.weight(k) * static_cast<double>(n)), 1.0)
          << "source " << k << " after " << n << " samples";
  }
  // Random access (a run resumed at any step) gives what the sequential walk gave.
  std::vector<std::pair<int, int64_t>> walk;
  for (int64_t n = 0; n < 2000; ++n) walk.push_back(blend.source_of(n));
  std::mt19937 rng(3);
  for (int i = 0; i < 500; ++i) {
    const int64_t n = static_cast<int64_t>(rng() % 2000);
    ASSERT_EQ(blend.source_of(n), walk[static_cast<size_t>(n)]) << n;
  }
  // The indices within each source run 0, 1, 2, ... in stream order.
  std::vector<int64_t> next(3, 0);
  for (const auto& [k, j] : walk) EXPECT_EQ(j, next[static_cast<size_t>(k)]++);
}

TEST_F(BlendFiles, SamplesAreTheSourcesOwnWindows) {
  const std::vector<std::string> paths = {file("a.h5", 0, 400), file("b.h5", 100, 300)};
  BlendedSampler blend(paths, {1, 1}, 8, 256, false, "sequential", 1);
  std::vector<int32_t> in(8 * 4), tgt(8 * 4);
  blend.load(0, 4, in.data(), tgt.data());
  // Equal weights alternate a, b, a, b; sequential windows start at 0, 8, ... of each.
  EXPECT_EQ(in[0], 0);
  EXPECT_EQ(in[8], 100);
  EXPECT_EQ(in[16], 8);
  EXPECT_EQ(in[24], 108);
  EXPECT_EQ(tgt[0], 1);
}

TEST_F(BlendFiles, SourcesMustShareTheVocabulary) {
  const std::string a = file("a.h5", 0, 400), b = file("b.h5", 0, 400, 300), c = file("c.h5", 0, 400, 256, "gpt2");
  testing::expect_one_line_error([&] { BlendedSampler(std::vector<std::string>{a, b}, {1, 1}, 8, 512, false, "sequential", 1); },
                                 {"b.h5: vocab_size 300 differs from 256 of", "a.h5"});
  testing::expect_one_line_error([&] { BlendedSampler(std::vector<std::string>{a, c}, {1, 1}, 8, 512, false, "sequential", 1); },
                                 {"c.h5: tokenizer gpt2 differs from byte"});
  testing::expect_one_line_error([&] { BlendedSampler(std::vector<std::string>{a}, {0}, 8, 512, false, "sequential", 1); },
                                 {"blend weights must be positive"});
}

}  // namespace
}  // namespace pipetrain
