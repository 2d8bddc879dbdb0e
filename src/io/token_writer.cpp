// TokenFileWriter and write_token_file (see pipetrain/io/token_writer.hpp): writes the
// HDF5 token-file format into `out.tmp` and renames it into place on commit.
#include <algorithm>
#include <filesystem>
#include <system_error>
#include <utility>

#include "pipetrain/core/error.hpp"
#include "pipetrain/io/token_writer.hpp"

namespace pipetrain {
namespace {

using h5io::Id;

void write_attributes(hid_t obj, int64_t vocab, const std::string& tokenizer,
                      const std::string& path) {
  Id scalar(H5Screate(H5S_SCALAR));
  Id vattr(H5Acreate2(obj, kVocabAttr, H5T_STD_I64LE, scalar.get(), H5P_DEFAULT, H5P_DEFAULT));
  if (!vattr.valid() || H5Awrite(vattr.get(), H5T_NATIVE_INT64, &vocab) < 0)
    fail("{}: cannot write attribute {} ({})", path, kVocabAttr, h5io::last_error());
  // Variable-length UTF-8: h5py reads it back as str.
  Id stype(H5Tcopy(H5T_C_S1));
  H5Tset_size(stype.get(), H5T_VARIABLE);
  H5Tset_cset(stype.get(), H5T_CSET_UTF8);
  Id tattr(H5Acreate2(obj, kTokenizerAttr, stype.get(), scalar.get(), H5P_DEFAULT, H5P_DEFAULT));
  const char* s = tokenizer.c_str();
  if (!tattr.valid() || H5Awrite(tattr.get(), stype.get(), &s) < 0)
    fail("{}: cannot write attribute {} ({})", path, kTokenizerAttr, h5io::last_error());
}

}  // namespace

TokenFileWriter::TokenFileWriter(std::string out, int64_t num_tokens, int64_t vocab_size,
                                 std::string tokenizer)
    : TokenFileWriter(std::move(out), num_tokens, vocab_size, std::move(tokenizer), MPI_COMM_NULL) {}

TokenFileWriter::TokenFileWriter(std::string out, int64_t num_tokens, int64_t vocab_size, std::string tokenizer,
                                 MPI_Comm comm)
    : out_(std::move(out)),
      tokenizer_(std::move(tokenizer)),
      total_(num_tokens),
      vocab_(vocab_size),
      comm_(comm) {
  if (comm_ != MPI_COMM_NULL && num_tokens == kTokensNotKnown)
    fail("{}: a collective write needs the token count up front", out_);
  if (out_.empty()) fail("no output file given");
  if (num_tokens < 0 && num_tokens != kTokensNotKnown) fail("{}: cannot write {} tokens", out_, num_tokens);
  growing_ = num_tokens == kTokensNotKnown;
  if (vocab_size < 1 || vocab_size > (int64_t{1} << 32))
    fail("{}: vocab_size {} out of range (1 .. 2^32)", out_, vocab_size);
  tmp_ = out_ + ".tmp";
  // `-o data/x.h5` in a fresh checkout: the folder is made, as checkpoint.dir's is.
  if (const auto parent = std::filesystem::path(out_).parent_path(); !parent.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
    if (ec && !std::filesystem::is_directory(parent))
      fail("{}: cannot create the folder {} ({})", out_, parent.string(), ec.message());
  }
  const bool narrow = vocab_size <= 65536;
  dtype_ = narrow ? "uint16" : "uint32";
  h5io::Quiet quiet;
  try {
    Id fapl = comm_ != MPI_COMM_NULL ? h5io::mpio_fapl(comm_, out_) : Id(H5Pcreate(H5P_FILE_ACCESS));
    file_ = Id(H5Fcreate(tmp_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()));
    if (!file_.valid()) fail("{}: cannot create {} ({})", out_, tmp_, h5io::last_error());
    const hsize_t dims = growing_ ? 0 : static_cast<hsize_t>(num_tokens), unlimited = H5S_UNLIMITED;
    Id space(H5Screate_simple(1, &dims, growing_ ? &unlimited : nullptr));
    Id dcpl(H5Pcreate(H5P_DATASET_CREATE));
    if (num_tokens > 0 || growing_) {  // chunked so huge files work; contiguous when empty
      const hsize_t chunk = static_cast<hsize_t>(growing_ ? kTokenChunk : std::min(num_tokens, kTokenChunk));
      H5Pset_chunk(dcpl.get(), 1, &chunk);
    }
    H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);
    dataset_ = Id(H5Dcreate2(file_.get(), kTokensDataset, narrow ? H5T_STD_U16LE : H5T_STD_U32LE,
                             space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT));
    if (!dataset_.valid())
      fail("{}: cannot create /{} ({})", tmp_, kTokensDataset, h5io::last_error());
    write_attributes(file_.get(), vocab_, tokenizer_, tmp_);
  } catch (...) {
    discard();
    throw;
  }
}

TokenFileWriter::~TokenFileWriter() {
  if (!committed_) discard();
}

// Collectively, an error on one rank ends the job (fail-fast): closing the file would wait
// for the others, so only the temporary file goes.
void TokenFileWriter::discard() {
  h5io::Quiet quiet;
  if (comm_ == MPI_COMM_NULL) {
    dataset_.reset();
    file_.reset();
  }
  std::error_code ec;
  std::filesystem::remove(tmp_, ec);
}

void TokenFileWriter::write_part(int64_t first, std::span<const uint32_t> tokens) {
  if (comm_ == MPI_COMM_NULL) fail("{}: write_part needs a collective writer", out_);
  const auto n = static_cast<int64_t>(tokens.size());
  if (first < 0 || first > total_ - n) fail("{}: tokens [{}, {}) lie outside the {} announced", out_, first, first + n, total_);
  for (int64_t i = 0; i < n; ++i)
    if (static_cast<int64_t>(tokens[static_cast<size_t>(i)]) >= vocab_)
      fail("{}: token {} at position {} is >= vocab_size {}", out_, tokens[static_cast<size_t>(i)], first + i, vocab_);
  h5io::Quiet quiet;
  Id space(H5Dget_space(dataset_.get()));
  const hsize_t start = static_cast<hsize_t>(first), cnt = static_cast<hsize_t>(n);
  Id mem(H5Screate_simple(1, &cnt, nullptr));
  if (n == 0) {
    H5Sselect_none(space.get());
    H5Sselect_none(mem.get());
  } else {
    H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, &start, nullptr, &cnt, nullptr);
  }
  const Id dxpl = h5io::transfer_list(h5io::Transfer::Collective);
  if (H5Dwrite(dataset_.get(), H5T_NATIVE_UINT32, mem.get(), space.get(), dxpl.get(), tokens.data()) < 0)
    fail("{}: writing tokens [{}, {}) failed ({})", tmp_, first, first + n, h5io::last_error());
  written_ += n;
}

template <typename T>
void TokenFileWriter::append_impl(std::span<const T> tokens, hid_t mem_type) {
  const auto n = static_cast<int64_t>(tokens.size());
  if (n == 0) return;
  if (committed_) fail("{}: append after commit", out_);
  if (!growing_ && n > total_ - written_)
    fail("{}: {} more tokens than the {} announced", out_, written_ + n - total_, total_);
  for (int64_t i = 0; i < n; ++i)
    if (static_cast<int64_t>(tokens[static_cast<size_t>(i)]) >= vocab_)
      fail("{}: token {} at position {} is >= vocab_size {}", out_, tokens[static_cast<size_t>(i)],
           written_ + i, vocab_);
  h5io::Quiet quiet;
  if (growing_) {
    const hsize_t size = static_cast<hsize_t>(written_ + n);
    if (H5Dset_extent(dataset_.get(), &size) < 0)
      fail("{}: cannot grow /{} to {} tokens ({})", tmp_, kTokensDataset, written_ + n, h5io::last_error());
  }
  Id space(H5Dget_space(dataset_.get()));
  const hsize_t start = static_cast<hsize_t>(written_), cnt = static_cast<hsize_t>(n);
  Id mem(H5Screate_simple(1, &cnt, nullptr));
  if (!space.valid() || !mem.valid() ||
      H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, &start, nullptr, &cnt, nullptr) < 0 ||
      H5Dwrite(dataset_.get(), mem_type, mem.get(), space.get(), H5P_DEFAULT, tokens.data()) < 0)
    fail("{}: writing tokens [{}, {}) failed ({})", tmp_, written_, written_ + n,
         h5io::last_error());
  written_ += n;
}

void TokenFileWriter::append(std::span<const uint16_t> tokens) {
  append_impl(tokens, H5T_NATIVE_UINT16);
}

void TokenFileWriter::append(std::span<const uint32_t> tokens) {
  append_impl(tokens, H5T_NATIVE_UINT32);
}

TokenFileInfo TokenFileWriter::commit() {
  if (committed_) fail("{}: committed twice", out_);
  if (comm_ != MPI_COMM_NULL) {  // the parts of every rank, then one rename
    int64_t all = written_;
    MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT64_T, MPI_SUM, comm_);
    if (all != total_) fail("{}: the ranks wrote {} of {} tokens", out_, all, total_);
    h5io::Quiet quiet;
    const bool ok = dataset_.reset() && file_.reset();
    if (!ok) fail("{}: closing {} failed ({})", out_, tmp_, h5io::last_error());
    int rank = 0;
    MPI_Comm_rank(comm_, &rank);
    std::error_code ec;
    if (rank == 0) std::filesystem::rename(tmp_, out_, ec);
    int failed = ec ? 1 : 0;
    MPI_Bcast(&failed, 1, MPI_INT, 0, comm_);
    if (failed) fail("{}: cannot rename {} into place ({})", out_, tmp_, ec ? ec.message() : "on rank 0");
    committed_ = true;
    return TokenFileInfo{out_, total_, vocab_, tokenizer_, dtype_};
  }
  if (growing_) total_ = written_;
  if (written_ != total_) fail("{}: wrote {} of {} tokens", out_, written_, total_);
  {
    h5io::Quiet quiet;
    const bool ok = dataset_.reset() && file_.reset();
    if (!ok) {
      const std::string why = h5io::last_error();
      discard();
      fail("{}: closing {} failed ({})", out_, tmp_, why);
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp_, out_, ec);
  if (ec) {
    discard();
    fail("{}: cannot rename {} into place ({})", out_, tmp_, ec.message());
  }
  committed_ = true;
  return TokenFileInfo{out_, total_, vocab_, tokenizer_, dtype_};
}

TokenFileInfo write_token_file(const std::string& out, std::span<const uint32_t> tokens,
                               int64_t vocab_size, const std::string& tokenizer) {
  TokenFileWriter w(out, static_cast<int64_t>(tokens.size()), vocab_size, tokenizer);
  w.append(tokens);
  return w.commit();
}

}  // namespace pipetrain
