// Tensor: a shape, a dtype, a device and a view into pooled storage on that device.
// Copies share storage (like a shared_ptr); views share it with an offset. The typed
// accessors check the dtype: using a bf16 tensor as f32 is an error naming both.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pipetrain/core/device.hpp"
#include "pipetrain/core/dtype.hpp"
#include "pipetrain/core/memory_pool.hpp"

namespace pipetrain {

class Tensor {
 public:
  Tensor() = default;
  // Uninitialised tensor from the pool.
  static Tensor empty(MemoryPool& pool, std::vector<int64_t> shape, DType dtype = DType::F32);
  // A view of `shape` starting `offset_elems` elements into this tensor's storage.
  Tensor view(int64_t offset_elems, std::vector<int64_t> shape) const;

  bool defined() const { return block_ != nullptr; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.at(static_cast<size_t>(i)); }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const;
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  DeviceId device() const { return device_; }
  std::string shape_str() const;
  std::string describe() const;  // "(4, 8) bf16 on host"

  // Typed element pointers; throw pipetrain::Error when the dtype differs.
  float* f32() const;
  bf16* bf16_data() const;
  int32_t* i32() const;
  void* raw() const;

 private:
  std::shared_ptr<PoolBlock> block_;
  int64_t offset_ = 0;  // in elements
  std::vector<int64_t> shape_;
  DType dtype_ = DType::F32;
  DeviceId device_;
};

// Throws pipetrain::Error "OP: A is (..) bf16 on host but B is (..) f32 on host" unless
// both tensors have the same dtype and device.
void check_same_kind(const char* op, const char* a_name, const Tensor& a, const char* b_name, const Tensor& b);
// Throws "OP: NAME is (..) bf16 on host, expected f32" unless `t` has dtype `want`.
void check_dtype(const char* op, const char* name, const Tensor& t, DType want);

}  // namespace pipetrain
