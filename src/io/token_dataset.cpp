// TokenDataset and inspect_token_file (see pipetrain/io/token_dataset.hpp): opens and
// validates HDF5 token files and reads windows of tokens with hyperslab selections.
#include "pipetrain/io/token_dataset.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <utility>

#include "pipetrain/core/error.hpp"

namespace pipetrain {
namespace {

using h5io::Id;

// "uint16", "int32", "float32", "string", ... for messages.
std::string describe_type(hid_t type) {
  const size_t bits = H5Tget_size(type) * 8;
  switch (H5Tget_class(type)) {
    case H5T_INTEGER:
      return fmt::format("{}int{}", H5Tget_sign(type) == H5T_SGN_NONE ? "u" : "", bits);
    case H5T_FLOAT:
      return fmt::format("float{}", bits);
    case H5T_STRING:
      return "string";
    default:
      return "a non-numeric type";
  }
}

struct OpenedFile {
  Id file, dataset;
  TokenFileInfo info;
};

// Opens and validates one token file. The caller holds an h5io::Quiet.
OpenedFile open_token_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) fail("{}: no such file", path);
  if (fs::is_directory(path, ec)) fail("{}: is a directory, not a token file", path);
  if (std::FILE* f = std::fopen(path.c_str(), "rb")) {
    std::fclose(f);
  } else {
    fail("{}: cannot open ({})", path, std::strerror(errno));
  }
#if H5_VERSION_GE(1, 12, 0)
  const htri_t is_h5 = H5Fis_accessible(path.c_str(), H5P_DEFAULT);
#else
  const htri_t is_h5 = H5Fis_hdf5(path.c_str());
#endif
  h5io::last_error();
  if (is_h5 <= 0) fail("{}: not an HDF5 file", path);

  OpenedFile o;
  o.info.path = path;
  Id fapl(H5Pcreate(H5P_FILE_ACCESS));
#if H5_VERSION_GE(1, 10, 7)
  // Lock when the file system can; read anyway where it cannot (e.g. some Lustre mounts).
  H5Pset_file_locking(fapl.get(), true, true);
#endif
  o.file = Id(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()));
  if (!o.file.valid()) fail("{}: cannot open HDF5 file ({})", path, h5io::last_error());

  if (H5Lexists(o.file.get(), kTokensDataset, H5P_DEFAULT) <= 0)
    fail("{}: no /{} dataset", path, kTokensDataset);
  o.dataset = Id(H5Oopen(o.file.get(), kTokensDataset, H5P_DEFAULT));
  if (!o.dataset.valid() || H5Iget_type(o.dataset.get()) != H5I_DATASET)
    fail("{}: /{} is not a dataset", path, kTokensDataset);

  Id space(H5Dget_space(o.dataset.get()));
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank != 1)
    fail("{}: /{} has rank {}, need a 1-D array of uint16 or uint32", path, kTokensDataset, rank);
  hsize_t dim = 0;
  H5Sget_simple_extent_dims(space.get(), &dim, nullptr);
  o.info.num_tokens = static_cast<int64_t>(dim);

  Id type(H5Dget_type(o.dataset.get()));
  const bool is_uint =
      H5Tget_class(type.get()) == H5T_INTEGER && H5Tget_sign(type.get()) == H5T_SGN_NONE;
  const size_t size = H5Tget_size(type.get());
  if (!is_uint || (size != 2 && size != 4))
    fail("{}: /{} holds {}, need uint16 or uint32", path, kTokensDataset,
         describe_type(type.get()));
  o.info.dtype = size == 2 ? "uint16" : "uint32";

  // Attributes: on the root group (what we write), else on /tokens.
  auto vocab = h5io::read_int_attr(o.file.get(), kVocabAttr, path);
  if (!vocab) vocab = h5io::read_int_attr(o.dataset.get(), kVocabAttr, path);
  if (vocab && *vocab <= 0) fail("{}: bad {} {}", path, kVocabAttr, *vocab);
  o.info.vocab_size = vocab.value_or(0);
  auto tok = h5io::read_string_attr(o.file.get(), kTokenizerAttr, path);
  if (!tok) tok = h5io::read_string_attr(o.dataset.get(), kTokenizerAttr, path);
  o.info.tokenizer = tok.value_or("");
  return o;
}

}  // namespace

TokenFileInfo inspect_token_file(const std::string& path) {
  h5io::Quiet quiet;
  return open_token_file(path).info;
}

TokenDataset::TokenDataset(const std::vector<std::string>& files, int seq_len, int model_vocab, bool respect_documents,
                           bool pack_documents, MPI_Comm scan_comm)
    : paths_(files), seq_len_(seq_len), model_vocab_(model_vocab) {
  if (files.empty()) fail("no token files given");
  if (respect_documents && pack_documents)
    fail(
        "data.respect_documents and data.pack_documents exclude each other: choose windows inside documents or "
        "sequences packed with whole documents");
  if (seq_len < 1) fail("seq_len must be at least 1, got {}", seq_len);
  if (model_vocab < 1) fail("model.vocab_size must be at least 1, got {}", model_vocab);
  h5io::Quiet quiet;
  std::string tokenizer_from;  // the first file with a tokenizer attribute
  files_.reserve(files.size());
  for (const auto& path : files) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec) && MegatronDataset::exists(path)) {
      File f;
      f.path = path;
      f.megatron = std::make_unique<MegatronDataset>(path);
      f.first = total_;
      f.count = f.megatron->num_tokens();
      total_ += f.count;
      files_.push_back(std::move(f));
      continue;
    }
    if (respect_documents)
      fail("{}: data.respect_documents needs each source's documents; HDF5 token files have none (Megatron "
           "datasets do)",
           path);
    OpenedFile o = open_token_file(path);
    if (o.info.vocab_size > model_vocab)
      fail("{}: vocab_size {} exceeds model.vocab_size {}", path, o.info.vocab_size, model_vocab);
    vocab_ = std::max(vocab_, static_cast<int>(o.info.vocab_size));
    File f;
    f.path = path;
    f.file = std::move(o.file);
    f.dataset = std::move(o.dataset);
    f.first = total_;
    f.count = o.info.num_tokens;
    if (f.count > INT64_MAX - total_) fail("{}: {} tokens: the files together hold more than 2^63", path, f.count);
    total_ += f.count;
    files_.push_back(std::move(f));
    if (!o.info.tokenizer.empty()) {
      if (tokenizer_from.empty()) {
        tokenizer_ = o.info.tokenizer;
        tokenizer_from = path;
      } else if (o.info.tokenizer != tokenizer_) {
        fail("{}: tokenizer {} differs from {} in {}", path, o.info.tokenizer, tokenizer_,
             tokenizer_from);
      }
    }
  }
  if (total_ < int64_t{seq_len} + 1) {
    std::string names = files[0];
    for (size_t i = 1; i < files.size(); ++i) names += " + " + files[i];
    fail("{}: {} tokens, need at least seq_len+1 = {}", names, total_, seq_len + 1);
  }
  windows_ = (total_ - 1) / seq_len;
  if (respect_documents) {
    for (const File& f : files_) {
      const auto& docs = f.megatron->document_starts();
      for (size_t d = 0; d + 1 < docs.size(); ++d)
        for (int64_t s = docs[d]; s + seq_len < docs[d + 1]; s += seq_len) starts_.push_back(f.first + s);
    }
    if (starts_.empty())
      fail("{}: no document holds seq_len+1 = {} tokens (data.respect_documents = true)", files[0], seq_len + 1);
    windows_ = static_cast<int64_t>(starts_.size());
  }
  if (pack_documents) {
    packing_ = std::make_unique<DocumentPacking>(document_boundaries(scan_comm), seq_len);
    if (packing_->num_sequences() == 0)
      fail("{}: no document has two tokens to pack (data.pack_documents = true)", files[0]);
    windows_ = packing_->num_sequences();
  }
}

TokenDataset::~TokenDataset() = default;

void TokenDataset::read_window(int64_t w, int32_t* out) const {
  if (w < 0 || w >= windows_)
    fail("window {} out of range: the dataset has {} windows", w, windows_);
  if (packing_) fail("read_window: the dataset packs documents; read its sequences with read_sample");
  read_tokens(window_start(w), int64_t{seq_len_} + 1, out);
}

void TokenDataset::read_sample(int64_t w, int32_t* inputs, int32_t* targets, int32_t* positions) const {
  if (packing_) return read_packed(w, inputs, targets, positions);
  std::vector<int32_t> window(inputs || targets ? static_cast<size_t>(seq_len_) + 1 : 0);
  if (!window.empty()) read_window(w, window.data());
  for (int t = 0; t < seq_len_; ++t) {
    if (inputs) inputs[t] = window[static_cast<size_t>(t)];
    if (targets) targets[t] = window[static_cast<size_t>(t) + 1];
    if (positions) positions[t] = t;
  }
}

void TokenDataset::read_tokens(int64_t first, int64_t count, int32_t* out) const {
  if (first < 0 || count < 0 || first > total_ - count)
    fail("tokens [{}, {}) out of range: the dataset has {} tokens", first, first + count, total_);
  if (count == 0) return;
  h5io::Quiet quiet;
  // The last file whose first token is <= first (empty files are skipped below).
  auto it = std::upper_bound(files_.begin(), files_.end(), first,
                             [](int64_t pos, const File& f) { return pos < f.first; });
  size_t fi = static_cast<size_t>(it - files_.begin()) - 1;
  int64_t done = 0;
  while (done < count) {
    const File& f = files_[fi++];
    const int64_t off = first + done - f.first;
    const int64_t n = std::min(count - done, f.count - off);
    if (n <= 0) continue;
    int32_t* dst = out + done;
    if (f.megatron) {
      f.megatron->read(off, n, dst);
      for (int64_t i = 0; i < n; ++i)
        if (dst[i] >= model_vocab_)
          fail("{}: token {} at index {} is >= model.vocab_size {}", f.path, dst[i], off + i, model_vocab_);
      done += n;
      continue;
    }
    Id space(H5Dget_space(f.dataset.get()));
    const hsize_t start = static_cast<hsize_t>(off), cnt = static_cast<hsize_t>(n);
    Id mem(H5Screate_simple(1, &cnt, nullptr));
    // HDF5 widens uint16 to uint32 on the way; int32 and uint32 share the bit layout.
    if (!space.valid() || !mem.valid() ||
        H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, &start, nullptr, &cnt, nullptr) < 0 ||
        H5Dread(f.dataset.get(), H5T_NATIVE_UINT32, mem.get(), space.get(), H5P_DEFAULT, dst) < 0)
      fail("{}: reading tokens [{}, {}) failed ({})", f.path, off, off + n, h5io::last_error());
    const auto limit = static_cast<uint32_t>(model_vocab_);
    for (int64_t i = 0; i < n; ++i) {
      const auto v = static_cast<uint32_t>(dst[i]);
      if (v >= limit)
        fail("{}: token {} at index {} is >= model.vocab_size {}", f.path, v, off + i,
             model_vocab_);
    }
    done += n;
  }
}

}  // namespace pipetrain
