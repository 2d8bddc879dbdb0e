// safetensors files (Hugging Face): an 8-byte little-endian header length N, N bytes of
// JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}},
// then the raw little-endian tensors (offsets count from the end of the header). Read by
// memory-mapping the file; F32, F16 and BF16 tensors are widened to f32. Written as F32,
// header padded with spaces to a multiple of 8 bytes (as Hugging Face writes it), through
// a temporary file renamed when complete.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace pipetrain {

class SafetensorsFile {
 public:
  // Maps `path`; throws pipetrain::Error naming it: missing, too short, a header that is
  // not JSON or not a safetensors header, a tensor outside the data or of an unsupported dtype.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  std::vector<std::string> names() const;
  const std::vector<int64_t>& shape(const std::string& name) const;
  std::string dtype(const std::string& name) const;
  // The tensor's values as f32 (widened from F16 / BF16); throws naming file and tensor.
  std::vector<float> read_f32(const std::string& name) const;

 private:
  struct Entry {
    std::string dtype;
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;
  };
  const Entry& entry(const std::string& name) const;
  std::string path_;
  const unsigned char* map_ = nullptr;
  size_t size_ = 0;
  uint64_t data_start_ = 0;
  std::map<std::string, Entry> tensors_;
};

struct SafetensorsTensor {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;
};

// Writes `tensors` (F32, in the order given) to `path`.
void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace pipetrain
