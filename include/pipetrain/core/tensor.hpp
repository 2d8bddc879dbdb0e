// Tensor: a shape, a dtype and a view into pooled device storage.
// Copies share storage (like a shared_ptr); views share it with an offset.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pipetrain/core/memory_pool.hpp"

namespace pipetrain {

enum class DType { F32, I32 };
size_t dtype_size(DType t);

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
  std::string shape_str() const;

  float* f32() const;
  int32_t* i32() const;
  void* raw() const;

 private:
  std::shared_ptr<PoolBlock> block_;
  int64_t offset_ = 0;  // in elements
  std::vector<int64_t> shape_;
  DType dtype_ = DType::F32;
};

}  // namespace pipetrain
