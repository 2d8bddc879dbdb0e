// `data text` under mpirun (io/data_convert.hpp: tokenize_text_parallel): whatever the
// number of ranks, the dataset holds exactly the ids one rank writes — slices cut where
// encoding in parts gives the same ids, an empty file and a file with no place to cut, the
// end-of-text tokens where one rank puts them — and an error on one rank fails every rank
// before anything is written. Packed documents found by one rank's reading of a file (and
// broadcast) are those every rank finds alone.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "mpi/mpi_fixtures.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/io/data_convert.hpp"
#include "pipetrain/io/token_dataset.hpp"
#include "pipetrain/io/token_writer.hpp"

namespace pipetrain {
namespace {

namespace fs = std::filesystem;
using namespace testing;

// A directory every rank sees (rank 0 names and creates it).
std::string shared_dir() {
  char name[256] = {};
  if (world_rank() == 0) {
    const std::string d = (fs::temp_directory_path() / fmt::format("pipetrain_par_{}", ::getpid())).string();
    fs::create_directories(d);
    std::snprintf(name, sizeof name, "%s", d.c_str());
  }
  MPI_Bcast(name, sizeof name, MPI_CHAR, 0, MPI_COMM_WORLD);
  return name;
}

std::vector<int32_t> tokens_of(const std::string& path) {
  const TokenDataset ds({path}, 1, 1 << 30);
  std::vector<int32_t> v(static_cast<size_t>(ds.num_tokens()));
  ds.read_tokens(0, ds.num_tokens(), v.data());
  return v;
}

TEST(TokenizeTextParallel, EveryRankCountWritesTheSingleRankIds) {
  const std::string dir = shared_dir();
  const std::string src = PIPETRAIN_SOURCE_DIR;
  std::string cjk;
  for (int i = 0; i < 200000; ++i) cjk += "日本語";  // 1.8 MB: a slice boundary falls inside
  if (world_rank() == 0) {
    std::ofstream(dir + "/empty.txt");
    std::ofstream(dir + "/cjk.txt") << cjk;  // no place to cut: a slice starting inside moves to its end
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const std::vector<std::string> inputs = {src + "/inputs/austen.txt", dir + "/empty.txt", dir + "/cjk.txt",
                                           src + "/tests/data/unicode_sample.txt", dir + "/empty.txt"};
  for (const char* name : {"gpt2", "byte"}) {
    SCOPED_TRACE(name);
    const auto tok = make_tokenizer(name);
    const bool eot = tok->end_of_text().has_value();
    const std::string one = fmt::format("{}/one_{}_{}.h5", dir, name, world_rank()), all = fmt::format("{}/all_{}.h5", dir, name);
    tokenize_text(inputs, one, *tok, eot);
    const TokenFileInfo info = tokenize_text_parallel(MPI_COMM_WORLD, inputs, all, *tok, eot);
    EXPECT_EQ(info.tokenizer, name);
    const auto want = tokens_of(one), got = tokens_of(all);
    EXPECT_EQ(got.size(), want.size());
    EXPECT_TRUE(got == want) << "the ranks' dataset differs from one rank's";
    if (eot) {
      EXPECT_EQ(std::count(got.begin(), got.end(), 50256), 5);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  // Bad bytes in one rank's slice: every rank fails, nothing is left behind.
  if (world_rank() == 0) {
    std::string text;
    for (int i = 0; i < 20000; ++i) text += "word ";
    text[text.size() * 3 / 4] = '\xff';
    std::ofstream(dir + "/bad.txt") << text;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const auto tok = make_tokenizer("gpt2");
  EXPECT_THROW(tokenize_text_parallel(MPI_COMM_WORLD, {dir + "/bad.txt"}, dir + "/bad.h5", *tok, false), Error);
  MPI_Barrier(MPI_COMM_WORLD);
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().string().find("bad.h5"), std::string::npos) << e.path() << " was left behind";
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(dir);
}

TEST(PackedDocumentsFoundOnce, EveryRankHasTheSingleRanksSequences) {
  const std::string dir = shared_dir(), path = dir + "/packed.h5";
  const uint32_t E = 50256;  // GPT-2's end of text: documents of 3 to 9 tokens
  std::vector<uint32_t> tokens;
  for (int d = 0; d < 40; ++d) {
    for (int i = 0; i < 2 + d % 7; ++i) tokens.push_back(static_cast<uint32_t>(100 * d + i));
    tokens.push_back(E);
  }
  if (world_rank() == 0) write_token_file(path, tokens, 50257, "gpt2");
  MPI_Barrier(MPI_COMM_WORLD);
  const TokenDataset shared({path}, 16, 50304, false, true, MPI_COMM_WORLD), alone({path}, 16, 50304, false, true);
  ASSERT_EQ(shared.num_windows(), alone.num_windows());
  std::vector<int32_t> in(16), tgt(16), pos(16), in1(16), tgt1(16), pos1(16);
  for (int64_t w = 0; w < alone.num_windows(); ++w) {
    shared.read_sample(w, in.data(), tgt.data(), pos.data());
    alone.read_sample(w, in1.data(), tgt1.data(), pos1.data());
    EXPECT_EQ(in, in1) << "sequence " << w << " on rank " << world_rank();
    EXPECT_EQ(tgt, tgt1) << "sequence " << w << " on rank " << world_rank();
    EXPECT_EQ(pos, pos1) << "sequence " << w << " on rank " << world_rank();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove(path);
}

}  // namespace
}  // namespace pipetrain
