// Typed tensors: bf16 conversion (round to nearest even, NaN and infinity kept), tensors
// carrying dtype and device from their pool, and the errors a dtype or device mismatch
// gives.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "pipetrain/core/host_allocator.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/core/tensor.hpp"

namespace pipetrain {
namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

TEST(Bf16, EveryBf16ValueRoundTripsThroughFloat) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const bf16 h{static_cast<uint16_t>(b)};
    const float f = to_float(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(to_float(to_bf16(f))));
      EXPECT_EQ(std::signbit(to_float(to_bf16(f))), std::signbit(f));
    } else {
      EXPECT_EQ(to_bf16(f).bits, h.bits) << b;
    }
  }
}

TEST(Bf16, RoundsToNearestTiesToEven) {
  // Between 1 (0x3f80) and the next bf16 1 + 2^-7 (0x3f81): the halfway point goes to the
  // even one (1), anything above it up; between 0x3f81 and 0x3f82 the tie goes up (even).
  EXPECT_EQ(to_bf16(1.0f + std::ldexp(1.0f, -8)).bits, 0x3f80);
  EXPECT_EQ(to_bf16(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f)).bits, 0x3f81);
  EXPECT_EQ(to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)).bits, 0x3f82);
  EXPECT_EQ(to_bf16(-1.0f - std::ldexp(1.0f, -8)).bits, 0xbf80);
  // Overflow rounds to infinity; infinities and signed zero stay.
  EXPECT_TRUE(std::isinf(to_float(to_bf16(std::numeric_limits<float>::max()))));
  EXPECT_EQ(to_float(to_bf16(-std::numeric_limits<float>::infinity())), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(to_bf16(-0.0f).bits, 0x8000);
  // A NaN whose payload sits only in the low bits is still a NaN (not an infinity).
  EXPECT_TRUE(std::isnan(to_float(to_bf16(from_bits(0x7f800001u)))));
  EXPECT_TRUE(std::isnan(to_float(to_bf16(from_bits(0xff800001u)))));
}

TEST(Bf16, IsTheNearestRepresentableValue) {
  std::mt19937 gen(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    const float f = from_bits(bits(gen));
    if (!std::isfinite(f) || std::abs(f) > 3e38f) continue;
    const bf16 r = to_bf16(f);
    const double err = std::abs(static_cast<double>(f) - to_float(r));
    // Its neighbours (one bf16 step either way) are no closer.
    for (int d : {-1, 1}) {
      const float n = to_float(bf16{static_cast<uint16_t>(r.bits + d)});
      if (std::isfinite(n)) {
        EXPECT_LE(err, std::abs(static_cast<double>(f) - n)) << f;
      }
    }
    // Relative error at most 2^-9 (half a unit of the 8-bit significand) for normals.
    if (std::abs(f) > 1e-37f) {
      EXPECT_LE(err, std::ldexp(std::abs(static_cast<double>(f)), -8));
    }
  }
}

using FakeDevice = HostAllocator;  // host memory that claims another device

TEST(TypedTensor, CarriesDtypeAndTheDeviceOfItsPool) {
  FakeDevice host({DeviceKind::Host, 0}), gpu({DeviceKind::Cuda, 1});
  auto host_pool = MemoryPool::create(host), gpu_pool = MemoryPool::create(gpu);
  const Tensor a = Tensor::empty(*host_pool, {4, 8}, DType::BF16);
  const Tensor b = Tensor::empty(*gpu_pool, {4, 8}, DType::BF16);
  EXPECT_EQ(a.bytes(), 64u);
  EXPECT_EQ(a.describe(), "(4, 8) bf16 on host");
  EXPECT_EQ(b.describe(), "(4, 8) bf16 on cuda:1");
  EXPECT_EQ(a.view(8, {2, 8}).device(), a.device());
  EXPECT_EQ(a.view(8, {2, 8}).dtype(), DType::BF16);
  EXPECT_EQ(reinterpret_cast<char*>(a.view(8, {2, 8}).bf16_data()) - reinterpret_cast<char*>(a.bf16_data()), 16);
}

TEST(TypedTensor, MismatchesAreErrorsNamingBothTensors) {
  FakeDevice host({DeviceKind::Host, 0}), gpu({DeviceKind::Cuda, 0});
  auto host_pool = MemoryPool::create(host), gpu_pool = MemoryPool::create(gpu);
  const Tensor a = Tensor::empty(*host_pool, {4, 8}, DType::BF16);
  const Tensor f = Tensor::empty(*host_pool, {4, 8}, DType::F32);
  const Tensor g = Tensor::empty(*gpu_pool, {4, 8}, DType::F32);
  try {
    (void)a.f32();
    ADD_FAILURE() << "f32() of a bf16 tensor";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "Tensor::f32: the tensor is (4, 8) bf16 on host, expected f32");
  }
  EXPECT_THROW((void)f.bf16_data(), Error);
  EXPECT_THROW((void)f.i32(), Error);
  EXPECT_NO_THROW(check_same_kind("add", "a", f, "b", f));
  try {
    check_same_kind("add", "out", f, "x", g);
    ADD_FAILURE() << "host and cuda tensors accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "add: out is (4, 8) f32 on host but x is (4, 8) f32 on cuda:0");
  }
  EXPECT_THROW(check_same_kind("add", "out", f, "x", a), Error);
  EXPECT_THROW(check_dtype("gemm", "A", a, DType::F32), Error);
}

}  // namespace
}  // namespace pipetrain
