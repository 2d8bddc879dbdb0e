#include "pipetrain/core/tensor.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "pipetrain/core/error.hpp"

namespace pipetrain {

static int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

Tensor Tensor::empty(MemoryPool& pool, std::vector<int64_t> shape, DType dtype) {
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = pool.device();
  t.block_ = pool.acquire(static_cast<size_t>(product(t.shape_)) * dtype_size(dtype));
  return t;
}

Tensor Tensor::view(int64_t offset_elems, std::vector<int64_t> shape) const {
  if (offset_elems < 0 || offset_ + offset_elems + product(shape) >
                              static_cast<int64_t>(block_->bytes / dtype_size(dtype_)))
    fail("tensor view [{}, +{}) out of bounds of a {} storage", offset_elems, product(shape),
         shape_str());
  Tensor t = *this;
  t.offset_ = offset_ + offset_elems;
  t.shape_ = std::move(shape);
  return t;
}

int64_t Tensor::numel() const { return product(shape_); }

std::string Tensor::shape_str() const { return fmt::format("({})", fmt::join(shape_, ", ")); }

void* Tensor::raw() const {
  return block_ ? static_cast<char*>(block_->ptr) + offset_ * static_cast<int64_t>(dtype_size(dtype_))
                : nullptr;
}
std::string Tensor::describe() const {
  return fmt::format("{} {} on {}", shape_str(), dtype_name(dtype_), device_.str());
}

void check_dtype(const char* op, const char* name, const Tensor& t, DType want) {
  if (t.dtype() != want) fail("{}: {} is {}, expected {}", op, name, t.describe(), dtype_name(want));
}

void check_same_kind(const char* op, const char* a_name, const Tensor& a, const char* b_name, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.device() != b.device())
    fail("{}: {} is {} but {} is {}", op, a_name, a.describe(), b_name, b.describe());
}

float* Tensor::f32() const {
  if (block_) check_dtype("Tensor::f32", "the tensor", *this, DType::F32);
  return static_cast<float*>(raw());
}
bf16* Tensor::bf16_data() const {
  if (block_) check_dtype("Tensor::bf16_data", "the tensor", *this, DType::BF16);
  return static_cast<bf16*>(raw());
}
int32_t* Tensor::i32() const {
  if (block_) check_dtype("Tensor::i32", "the tensor", *this, DType::I32);
  return static_cast<int32_t*>(raw());
}

}  // namespace pipetrain
