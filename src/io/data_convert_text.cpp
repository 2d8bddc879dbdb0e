// tokenize_text (see pipetrain/io/data_convert.hpp): text files through a Tokenizer into
// one token file — a growing one on one rank, or each rank's slice of the input written
// collectively at its place.
#include <mpi.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>

#include "pipetrain/core/error.hpp"
#include "pipetrain/io/data_convert.hpp"
#include "pipetrain/io/h5io.hpp"

namespace pipetrain {
namespace {

// Encodes bytes [begin, end) of `path` in blocks, cut where encoding in parts gives the ids
// of the whole (stream_split); `begin` must be such a place (or 0). sink(ids) takes them.
template <typename Sink>
void encode_range(const std::string& path, int64_t begin, int64_t end, const Tokenizer& tok, size_t block_bytes,
                  TextProgress& p, const std::function<void(const TextProgress&)>& progress, Sink&& sink) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail("{}: cannot open ({})", path, std::strerror(errno));
  std::vector<int32_t> ids;
  std::string text, block(std::max<size_t>(block_bytes, 1), '\0');
  int64_t offset = begin;  // of `text` in the file
  auto encode = [&](size_t n) {
    ids.clear();
    tok.encode(std::string_view(text).substr(0, n), ids, path, offset);
    sink(ids);
    p.tokens += static_cast<int64_t>(ids.size());
    text.erase(0, n);
    offset += static_cast<int64_t>(n);
  };
  try {
    if (begin > 0 && std::fseek(f, static_cast<long>(begin), SEEK_SET) != 0)
      fail("{}: cannot seek to byte {} ({})", path, begin, std::strerror(errno));
    for (int64_t left = end - begin; left > 0;) {
      const size_t got = std::fread(block.data(), 1, static_cast<size_t>(std::min<int64_t>(left, static_cast<int64_t>(block.size()))), f);
      if (got == 0) fail("{}: read failed ({})", path, std::ferror(f) ? std::strerror(errno) : "shorter than its size");
      left -= static_cast<int64_t>(got);
      text.append(block, 0, got);
      p.bytes_done += static_cast<int64_t>(got);
      if (const size_t cut = stream_split(text); cut > 0) encode(cut);
      if (progress) progress(p);
    }
    if (!text.empty()) encode(text.size());
  } catch (...) {
    std::fclose(f);
    throw;
  }
  std::fclose(f);
}

std::vector<int64_t> input_sizes(const std::vector<std::string>& inputs, int64_t& total) {
  if (inputs.empty()) fail("no input files given");
  std::vector<int64_t> sizes;
  total = 0;
  for (const auto& path : inputs) {  // every input checked before anything is written
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) fail("{}: no such file", path);
    total += sizes.emplace_back(static_cast<int64_t>(std::filesystem::file_size(path, ec)));
  }
  return sizes;
}

// The first place at or after byte `at` of `path` where the text may be cut (stream_split's
// rule: before a space between two non-space ASCII characters), or the file's size.
int64_t next_cut(const std::string& path, int64_t at, int64_t size) {
  if (at <= 0) return 0;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail("{}: cannot open ({})", path, std::strerror(errno));
  std::string window(size_t{1} << 20, '\0');
  int64_t found = size;
  for (int64_t from = at - 1; from + 2 < size && found == size; from += static_cast<int64_t>(window.size()) - 2) {
    std::fseek(f, static_cast<long>(from), SEEK_SET);
    const size_t got = std::fread(window.data(), 1, window.size(), f);
    if (got < 3) break;
    for (size_t i = 1; i + 1 < got; ++i) {
      auto ok = [](char c) { return static_cast<unsigned char>(c) > 0x20 && static_cast<unsigned char>(c) < 0x7f; };
      if (window[i] == ' ' && ok(window[i - 1]) && ok(window[i + 1])) {
        found = from + static_cast<int64_t>(i);
        break;
      }
    }
  }
  std::fclose(f);
  return found;
}

}  // namespace

TokenFileInfo tokenize_text(const std::vector<std::string>& inputs, const std::string& out, const Tokenizer& tok,
                            bool eot, const std::function<void(const TextProgress&)>& progress, size_t block_bytes) {
  if (eot && !tok.end_of_text()) fail("--eot: the {} tokenizer has no end-of-text token", tok.name());
  TextProgress p;
  const std::vector<int64_t> sizes = input_sizes(inputs, p.bytes_total);
  // A dataset of a known size when the tokenizer's count follows from the bytes; else one
  // that grows as the ids come.
  const std::optional<int64_t> known = tok.count_for(p.bytes_total);
  TokenFileWriter w(out, known ? *known : kTokensNotKnown, tok.vocab_size(), tok.name());
  std::vector<uint32_t> scratch;
  auto sink = [&](const std::vector<int32_t>& ids) {
    scratch.assign(ids.begin(), ids.end());
    w.append(std::span<const uint32_t>(scratch));
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    encode_range(inputs[i], 0, sizes[i], tok, block_bytes, p, progress, sink);
    if (eot) {
      sink(std::vector<int32_t>{*tok.end_of_text()});
      ++p.tokens;
    }
  }
  if (progress) progress(p);
  return w.commit();
}

TokenFileInfo tokenize_text_parallel(MPI_Comm comm, const std::vector<std::string>& inputs, const std::string& out,
                                     const Tokenizer& tok, bool eot,
                                     const std::function<void(const TextProgress&)>& progress) {
  int rank = 0, ranks = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &ranks);
  if (ranks == 1) return tokenize_text(inputs, out, tok, eot, progress);
  // Before any rank writes its part: the parts become one file only through parallel HDF5.
  if (!h5io::parallel_hdf5())
    fail("{}: {} ranks would write this file together, but pipetrain was built with a serial HDF5; run `data text` "
         "on one rank, or rebuild against a parallel HDF5",
         out, ranks);
  if (eot && !tok.end_of_text()) fail("--eot: the {} tokenizer has no end-of-text token", tok.name());
  TextProgress p;
  const std::vector<int64_t> sizes = input_sizes(inputs, p.bytes_total);
  std::vector<int64_t> first(sizes.size() + 1, 0);  // each file's place in the concatenation
  for (size_t i = 0; i < sizes.size(); ++i) first[i + 1] = first[i] + sizes[i];
  // This rank's slice: from the first place to cut at or after its share's start (every
  // rank computes its own; the next rank's start is this one's end).
  const int64_t nominal = p.bytes_total * rank / ranks;
  size_t fi = static_cast<size_t>(std::upper_bound(first.begin(), first.end(), nominal) - first.begin()) - 1;
  fi = std::min(fi, sizes.size() - 1);
  int64_t start = first[fi] + (tok.count_for(1) ? nominal - first[fi] : next_cut(inputs[fi], nominal - first[fi], sizes[fi]));
  std::vector<int64_t> starts(static_cast<size_t>(ranks));
  MPI_Allgather(&start, 1, MPI_INT64_T, starts.data(), 1, MPI_INT64_T, comm);
  const int64_t end = rank + 1 < ranks ? starts[static_cast<size_t>(rank) + 1] : p.bytes_total;

  // Tokenize the slice into a temporary file of raw ids (bounded memory), then write it at
  // its place in one collective pass.
  const std::string part = fmt::format("{}.part{}.tmp", out, rank);
  std::FILE* raw = std::fopen(part.c_str(), "w+b");
  if (!raw) fail("{}: cannot create ({})", part, std::strerror(errno));
  std::string error;
  int64_t mine = 0;
  try {
    std::vector<uint32_t> scratch;
    auto sink = [&](const std::vector<int32_t>& ids) {
      scratch.assign(ids.begin(), ids.end());
      if (std::fwrite(scratch.data(), 4, scratch.size(), raw) != scratch.size()) fail("{}: write failed", part);
      mine += static_cast<int64_t>(ids.size());
    };
    for (size_t i = 0; i < sizes.size(); ++i) {
      const int64_t a = std::max(start, first[i]), b = std::min(end, first[i + 1]);
      // The end-of-text token after file i: the rank whose slice holds the file's end (an
      // empty file's place; the last rank for one at the very end).
      const bool owns_end = sizes[i] > 0 ? first[i + 1] > start && first[i + 1] <= end
                                         : first[i] >= start && (first[i] < end || (rank == ranks - 1 && first[i] == end));
      if (a < b)
        encode_range(inputs[i], a - first[i], b - first[i], tok, size_t{4} << 20, p, rank == 0 ? progress : nullptr,
                     sink);
      if (eot && owns_end) sink(std::vector<int32_t>{*tok.end_of_text()});
    }
  } catch (const Error& e) {
    error = e.what();
  }
  // Every rank learns whether all succeeded before anything collective is written.
  int failed_rank = error.empty() ? ranks : rank;
  MPI_Allreduce(MPI_IN_PLACE, &failed_rank, 1, MPI_INT, MPI_MIN, comm);
  if (failed_rank < ranks) {
    std::fclose(raw);
    std::remove(part.c_str());
    if (!error.empty()) throw Error(error);
    fail("data text: rank {} failed (its error says why)", failed_rank);
  }
  int64_t offset = 0, total = 0;
  MPI_Exscan(&mine, &offset, 1, MPI_INT64_T, MPI_SUM, comm);
  if (rank == 0) offset = 0;
  MPI_Allreduce(&mine, &total, 1, MPI_INT64_T, MPI_SUM, comm);
  TokenFileWriter w(out, total, tok.vocab_size(), tok.name(), comm);
  constexpr int64_t kBlock = int64_t{1} << 22;
  int64_t rounds = (mine + kBlock - 1) / kBlock;
  MPI_Allreduce(MPI_IN_PLACE, &rounds, 1, MPI_INT64_T, MPI_MAX, comm);
  std::rewind(raw);
  std::vector<uint32_t> block;
  for (int64_t r = 0, done = 0; r < rounds; ++r) {
    const int64_t n = std::min(kBlock, mine - done);
    block.resize(static_cast<size_t>(std::max<int64_t>(n, 0)));
    if (n > 0 && std::fread(block.data(), 4, block.size(), raw) != block.size()) fail("{}: read failed", part);
    w.write_part(offset + done, std::span<const uint32_t>(block));
    done += std::max<int64_t>(n, 0);
  }
  std::fclose(raw);
  std::remove(part.c_str());
  p.tokens = total;
  if (progress && rank == 0) progress(p);
  return w.commit();
}

}  // namespace pipetrain
