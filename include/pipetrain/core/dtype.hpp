// Element types of tensors: f32, bf16 (storage for mixed precision: 8 exponent bits like
// f32, 7 mantissa bits) and i32 (tokens, targets, indices). Exports: DType, dtype_size,
// dtype_name, bf16, to_bf16, to_float.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace pipetrain {

enum class DType { F32, BF16, I32 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);  // "f32", "bf16", "i32"

// bfloat16: the upper half of an IEEE float32.
struct bf16 {
  uint16_t bits = 0;
};

// Round to nearest, ties to even (what hardware conversions do); NaN stays a quiet NaN of
// the same sign, infinities and overflow to infinity behave as in f32.
// Branch-free, so that loops over it vectorise (the CPU cast kernels: 2x in cache).
inline bf16 to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x0040u;
  return {static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded)};
}

inline float to_float(bf16 h) {
  const uint32_t u = static_cast<uint32_t>(h.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace pipetrain
