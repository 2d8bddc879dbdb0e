// MegatronDataset (see pipetrain/io/megatron_dataset.hpp): the index parsed and checked,
// the .bin mapped read-only.
#include "pipetrain/io/megatron_dataset.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "pipetrain/core/error.hpp"

namespace pipetrain {
namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};

// Sequential little-endian reads of the index, each checked against its size.
class IndexReader {
 public:
  explicit IndexReader(std::string path) : path_(std::move(path)), in_(path_, std::ios::binary) {
    if (!in_) fail("{}: cannot open ({})", path_, std::strerror(errno));
    in_.seekg(0, std::ios::end);
    size_ = static_cast<int64_t>(in_.tellg());
    in_.seekg(0);
  }
  void bytes(void* dst, int64_t n, const char* what) {
    if (n < 0 || pos_ + n > size_)
      fail("{}: truncated index: {} needs {} bytes at offset {}, the file has {}", path_, what, n, pos_, size_);
    in_.read(static_cast<char*>(dst), n);
    if (!in_) fail("{}: read failed at offset {}", path_, pos_);
    pos_ += n;
  }
  template <typename T>
  T value(const char* what) {
    T v{};
    bytes(&v, sizeof v, what);
    return v;  // x86-64 and aarch64 are little-endian, as the format
  }
  template <typename T>
  std::vector<T> array(uint64_t n, const char* what) {
    if (n > static_cast<uint64_t>(size_) / sizeof(T))
      fail("{}: truncated index: {} {} entries do not fit in {} bytes", path_, n, what, size_);
    std::vector<T> v(n);
    bytes(v.data(), static_cast<int64_t>(n * sizeof(T)), what);
    return v;
  }
  int64_t left() const { return size_ - pos_; }

 private:
  std::string path_;
  std::ifstream in_;
  int64_t size_ = 0, pos_ = 0;
};

}  // namespace

bool MegatronDataset::exists(const std::string& prefix) {
  std::error_code ec;
  return std::filesystem::is_regular_file(prefix + ".idx", ec);
}

MegatronDataset::MegatronDataset(const std::string& prefix) : prefix_(prefix) {
  const std::string idx = prefix + ".idx", bin = prefix + ".bin";
  IndexReader r(idx);
  char magic[9];
  r.bytes(magic, 9, "the magic");
  if (std::memcmp(magic, kMagic, 9) != 0) fail("{}: not a Megatron index (the magic is not MMIDIDX)", idx);
  const auto version = r.value<uint64_t>("the version");
  if (version != 1) fail("{}: index version {}, only version 1 is read", idx, version);
  const auto code = r.value<uint8_t>("the dtype");
  switch (code) {
    case 1: dtype_ = "uint8", width_ = 1; break;
    case 2: dtype_ = "int8", width_ = 1, signed_ = true; break;
    case 3: dtype_ = "int16", width_ = 2, signed_ = true; break;
    case 4: dtype_ = "int32", width_ = 4, signed_ = true; break;
    case 5: dtype_ = "int64", width_ = 8, signed_ = true; break;
    case 8: dtype_ = "uint16", width_ = 2; break;
    case 6:
    case 7: fail("{}: dtype code {} is a float type, not token ids", idx, code);
    default: fail("{}: unknown dtype code {}", idx, code);
  }
  const auto sequences = r.value<uint64_t>("the sequence count");
  const auto documents = r.value<uint64_t>("the document count");
  const auto lengths = r.array<int32_t>(sequences, "sequence length");
  const auto pointers = r.array<int64_t>(sequences, "sequence pointer");
  const auto doc_index = r.array<int64_t>(documents, "document index");
  // What follows may be the multimodal format's per-sequence modes; nothing else.
  if (r.left() != 0 && r.left() != static_cast<int64_t>(sequences))
    fail("{}: {} bytes after the document indices (expected none, or {} sequence modes)", idx, r.left(), sequences);
  // Sequences back to back from byte 0, so tokens are one stream.
  int64_t at = 0;
  for (uint64_t s = 0; s < sequences; ++s) {
    if (lengths[s] < 0) fail("{}: sequence {} has a negative length {}", idx, s, lengths[s]);
    if (pointers[s] != at)
      fail("{}: sequence {} starts at byte {}, expected {} (sequences must be contiguous in the .bin)", idx, s,
           pointers[s], at);
    at += int64_t{lengths[s]} * width_;
    if (at > (int64_t{1} << 60)) fail("{}: the sequences add up to more than 2^60 bytes", idx);
  }
  tokens_ = at / width_;
  if (documents == 0 || doc_index.front() != 0 || doc_index.back() != static_cast<int64_t>(sequences))
    fail("{}: document indices must run from 0 to the sequence count {}", idx, sequences);
  std::vector<int64_t> seq_start(sequences + 1, 0);
  for (uint64_t s = 0; s < sequences; ++s) seq_start[s + 1] = seq_start[s] + lengths[s];
  for (size_t d = 0; d < doc_index.size(); ++d) {
    if (doc_index[d] < 0 || doc_index[d] > static_cast<int64_t>(sequences) || (d > 0 && doc_index[d] < doc_index[d - 1]))
      fail("{}: document index {} is {}: not between the previous one and the sequence count {}", idx, d,
           doc_index[d], sequences);
    doc_starts_.push_back(seq_start[static_cast<size_t>(doc_index[d])]);
  }

  const int fd = ::open(bin.c_str(), O_RDONLY);
  if (fd < 0) fail("{}: cannot open ({})", bin, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail("{}: cannot read its size ({})", bin, std::strerror(errno));
  }
  if (st.st_size != at) {
    ::close(fd);
    fail("{}: {} bytes, but {} says its {} sequences hold {} bytes{}", bin, st.st_size, idx, sequences, at,
         st.st_size < at ? " (truncated)" : "");
  }
  if (at > 0) {
    void* p = ::mmap(nullptr, static_cast<size_t>(at), PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      fail("{}: cannot map ({})", bin, std::strerror(errno));
    }
    data_ = static_cast<const unsigned char*>(p);
    mapped_ = static_cast<size_t>(at);
  }
  ::close(fd);
}

MegatronDataset::~MegatronDataset() {
  if (data_) ::munmap(const_cast<unsigned char*>(data_), mapped_);
}

void MegatronDataset::read(int64_t first, int64_t count, int32_t* out) const {
  if (first < 0 || count < 0 || first > tokens_ - count)
    fail("{}.bin: tokens [{}, {}) out of range ({} tokens)", prefix_, first, first + count, tokens_);
  const unsigned char* p = data_ + first * width_;
  for (int64_t i = 0; i < count; ++i, p += width_) {
    int64_t v = 0;
    switch (width_) {
      case 1: v = signed_ ? int64_t{static_cast<int8_t>(*p)} : int64_t{*p}; break;
      case 2: {
        uint16_t u;
        std::memcpy(&u, p, 2);
        v = signed_ ? int64_t{static_cast<int16_t>(u)} : int64_t{u};
        break;
      }
      case 4: {
        int32_t s;
        std::memcpy(&s, p, 4);
        v = s;
        break;
      }
      default: std::memcpy(&v, p, 8);
    }
    if (v < 0 || v > std::numeric_limits<int32_t>::max())
      fail("{}.bin: token {} at index {} is not a token id", prefix_, v, first + i);
    out[i] = static_cast<int32_t>(v);
  }
}

}  // namespace pipetrain
