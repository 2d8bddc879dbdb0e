// safetensors reading (memory-mapped) and writing (pipetrain/io/safetensors.hpp).
#include "pipetrain/io/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "pipetrain/core/error.hpp"
#include "pipetrain/io/durable_file.hpp"

namespace pipetrain {

static_assert(std::endian::native == std::endian::little, "safetensors files are little-endian");

namespace {

size_t dtype_bytes(const std::string& d) { return d == "F32" ? 4 : (d == "F16" || d == "BF16") ? 2 : 0; }

float half_to_float(uint16_t h) {  // IEEE binary16 -> binary32, subnormals and specials included
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));  // inf, nan
  if (exp == 0) {
    if (mant == 0) return std::bit_cast<float>(sign);
    int e = -1;  // normalise the subnormal
    do {
      mant <<= 1;
      ++e;
    } while ((mant & 0x400u) == 0);
    mant &= 0x3ffu;
    return std::bit_cast<float>(sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant << 13));
  }
  return std::bit_cast<float>(sign | (exp + 127 - 15) << 23 | (mant << 13));
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) fail("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail("{}: cannot stat", path);
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    fail("{}: {} bytes: too short for a safetensors file", path, size_);
  }
  void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) fail("{}: cannot map: {}", path, std::strerror(errno));
  map_ = static_cast<const unsigned char*>(m);
  uint64_t n = 0;
  std::memcpy(&n, map_, 8);
  if (n > size_ - 8) fail("{}: header length {} exceeds the file ({} bytes): not a safetensors file", path, n, size_);
  data_start_ = 8 + n;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(map_ + 8, map_ + 8 + n);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: the header is not JSON: {}", path, e.what());
  }
  if (!header.is_object()) fail("{}: the header is not a JSON object", path);
  const uint64_t data_size = size_ - data_start_;
  for (const auto& [name, t] : header.items()) {
    if (name == "__metadata__") continue;
    Entry e;
    try {
      e.dtype = t.at("dtype").get<std::string>();
      e.shape = t.at("shape").get<std::vector<int64_t>>();
      const auto off = t.at("data_offsets").get<std::vector<uint64_t>>();
      if (off.size() != 2) fail("{}: tensor {}: data_offsets must have 2 entries", path, name);
      e.begin = off[0];
      e.end = off[1];
    } catch (const nlohmann::json::exception& ex) {
      fail("{}: tensor {}: bad header entry: {}", path, name, ex.what());
    }
    const size_t esize = dtype_bytes(e.dtype);
    if (esize == 0) fail("{}: tensor {}: dtype {} is not supported (F32, F16, BF16)", path, name, e.dtype);
    uint64_t count = 1;
    for (int64_t d : e.shape) {
      if (d < 0) fail("{}: tensor {}: negative dimension", path, name);
      count *= static_cast<uint64_t>(d);
    }
    if (e.begin > e.end || e.end > data_size || e.end - e.begin != count * esize)
      fail("{}: tensor {}: offsets [{}, {}) do not hold its {} {} values within the {} data bytes", path, name,
           e.begin, e.end, count, e.dtype, data_size);
    tensors_.emplace(name, std::move(e));
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(const_cast<unsigned char*>(map_), size_);
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& [n, e] : tensors_) out.push_back(n);
  return out;
}

const SafetensorsFile::Entry& SafetensorsFile::entry(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) fail("{}: no tensor {}", path_, name);
  return it->second;
}

const std::vector<int64_t>& SafetensorsFile::shape(const std::string& name) const { return entry(name).shape; }
std::string SafetensorsFile::dtype(const std::string& name) const { return entry(name).dtype; }

std::vector<float> SafetensorsFile::read_f32(const std::string& name) const {
  const Entry& e = entry(name);
  const unsigned char* p = map_ + data_start_ + e.begin;
  const size_t n = (e.end - e.begin) / dtype_bytes(e.dtype);
  std::vector<float> out(n);
  if (e.dtype == "F32") {
    std::memcpy(out.data(), p, n * 4);
  } else {
    for (size_t i = 0; i < n; ++i) {
      uint16_t h = 0;
      std::memcpy(&h, p + 2 * i, 2);
      out[i] = e.dtype == "BF16" ? std::bit_cast<float>(uint32_t{h} << 16) : half_to_float(h);
    }
  }
  return out;
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t at = 0;
  for (const auto& t : tensors) {
    uint64_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {at, at + 4 * n}}};
    at += 4 * n;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t len = text.size();
  write_durably(path, [&](std::ostream& out) {
    out.write(reinterpret_cast<const char*>(&len), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const auto& t : tensors) {
      uint64_t n = 1;
      for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
      out.write(reinterpret_cast<const char*>(t.data), static_cast<std::streamsize>(4 * n));
    }
  });
}

}  // namespace pipetrain
