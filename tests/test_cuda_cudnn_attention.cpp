// Attention on cuDNN (src/backend/cuda/cudnn_attention.hpp): the CUDA backend's bf16-qkv
// attention, causal and grouped-query, forward and backward on cuDNN's graphs, against the
// flash kernels (a second backend with PIPETRAIN_CUDNN_ATTENTION=0) and the CPU backend, within
// a bound derived from bf16 rounding; T = 1024 and T = 200 (not a multiple of 64), head sizes
// 64 and 128. The calls cuDNN is not asked for (f32 qkv, f32 storage, packed documents, a head
// size that is not a multiple of 8) give what the flash kernels give, bit for bit. The loader
// resolves every function it lists, GPU or not. Skips with "no GPU: <reason>" without a GPU
// and "no cuDNN: <reason>" where the library cannot be opened (the GPU check fails on both).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kernel_backends.hpp"
#include "kernel_reference.hpp"
#include "pipetrain/backend/backend.hpp"
#include "pipetrain/backend/cuda.hpp"
#include "pipetrain/core/dtype.hpp"
#include "pipetrain/core/error.hpp"
#ifdef PIPETRAIN_HAVE_CUDA
#include "../src/backend/cuda/cudnn_attention.hpp"
#include "../src/backend/cuda/cudnn_loader.hpp"
#endif

namespace pipetrain {
namespace {

using ref::DVec;
using ref::random_vec;
using ref::Vec;
using testing::DevBuf;

constexpr const char* kSwitch = "PIPETRAIN_CUDNN_ATTENTION";

// cuDNN opens at its first use and resolves every function the graphs call, GPU or not.
TEST(CudnnAttentionLoader, ResolvesEveryFunction) {
#ifdef PIPETRAIN_HAVE_CUDA
  const cuda::CudnnApi* api = nullptr;
  try {
    api = &cuda::cudnn();
  } catch (const Error& e) {
    GTEST_SKIP() << "no cuDNN: " << e.what();
  }
#define PIPETRAIN_EXPECT_RESOLVED(name) EXPECT_NE(api->name, nullptr) << #name;
  PIPETRAIN_CUDNN_FUNCTIONS(PIPETRAIN_EXPECT_RESOLVED)
#undef PIPETRAIN_EXPECT_RESOLVED
  EXPECT_EQ(api->cudnnGetVersion() / 10000, size_t{CUDNN_MAJOR});  // the major version the headers describe
  EXPECT_EQ(&cuda::cudnn(), api);                                  // opened once
#else
  GTEST_SKIP() << "built without CUDA: no cuDNN to open";
#endif
}

// Whether a forward's stash is cuDNN attention's (its type is the flag).
bool on_cudnn(const AttentionStash& stash) {
#ifdef PIPETRAIN_HAVE_CUDA
  return dynamic_cast<const cuda::CudnnAttentionStash*>(&stash) != nullptr;
#else
  (void)stash;
  return false;
#endif
}

// The cuDNN version the backend runs (e.g. 91900), 0 without CUDA.
size_t cudnn_version() {
#ifdef PIPETRAIN_HAVE_CUDA
  return cuda::cudnn().cudnnGetVersion();
#else
  return 0;
#endif
}

struct Shape {
  int B, T, NH, NKV, hs;
  int C() const { return NH * hs; }
  int width() const { return C() + 2 * NKV * hs; }  // a qkv row
};

// qkv as a bf16 run stores it (and its values widened), dout in f32.
struct Inputs {
  std::vector<bf16> qkv;
  Vec wide, dout;
};
Inputs inputs(const Shape& s, uint32_t seed) {
  Inputs in;
  in.wide = random_vec(size_t(s.B) * s.T * s.width(), seed, -2.0f, 2.0f);
  in.qkv.resize(in.wide.size());
  for (size_t i = 0; i < in.wide.size(); ++i) in.qkv[i] = to_bf16(in.wide[i]), in.wide[i] = to_float(in.qkv[i]);
  in.dout = random_vec(size_t(s.B) * s.T * s.C(), seed + 1);
  return in;
}

struct Options {
  DType storage = DType::BF16;
  const std::vector<int32_t>* positions = nullptr;
  bool f32_qkv = false;  // the f32-qkv forms (qkv widened)
};
// out and dqkv (both start as NaN: every element must be written), whether the forward ran
// on cuDNN, and what the backend printed meanwhile (a cuDNN refusal says why).
struct Result {
  Vec out, dqkv;
  bool cudnn = false;
  std::string log;
};

Result run(Backend& be, const Inputs& in, const Shape& s, const Options& o = {}) {
  auto pool = MemoryPool::create(be);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  DevBuf<bf16> half(be, in.qkv);
  DevBuf<float> wide(be, in.wide), dout(be, in.dout), out(be, Vec(in.dout.size(), nan)),
      dq(be, Vec(in.wide.size(), nan));
  std::unique_ptr<DevBuf<int32_t>> pos;
  if (o.positions) pos = std::make_unique<DevBuf<int32_t>>(be, *o.positions);
  const int32_t* p = pos ? pos->get() : nullptr;
  const bf16* q = half.get();
  const float* qf = wide.get();
  Result r;
  ::testing::internal::CaptureStderr();
  try {
    auto stash = o.f32_qkv ? be.attention_forward(out.get(), qf, s.B, s.T, s.C(), s.NH, s.NKV, *pool, o.storage, p)
                           : be.attention_forward(out.get(), q, s.B, s.T, s.C(), s.NH, s.NKV, *pool, o.storage, p);
    r.cudnn = on_cudnn(*stash);
    if (o.f32_qkv)
      be.attention_backward(dq.get(), dout.get(), qf, *stash, s.B, s.T, s.C(), s.NH, s.NKV, *pool, p);
    else
      be.attention_backward(dq.get(), dout.get(), q, *stash, s.B, s.T, s.C(), s.NH, s.NKV, *pool, p);
  } catch (...) {
    std::cerr << ::testing::internal::GetCapturedStderr();
    throw;
  }
  r.log = ::testing::internal::GetCapturedStderr();
  r.out = out.host();
  r.dqkv = dq.host();
  return r;
}

// |got - want| <= factor * bound everywhere (NaN fails).
::testing::AssertionResult within(const Vec& got, const Vec& want, const DVec& bound, double factor) {
  if (got.size() != want.size() || got.size() != bound.size()) return ::testing::AssertionFailure() << "size mismatch";
  size_t bad = 0, first = 0;
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]), allowed = factor * bound[i] + 1e-30;
    if (!(err <= allowed)) {
      if (bad++ == 0) first = i;
      worst = std::max(worst, std::isnan(err) ? INFINITY : err / allowed);
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << got.size() << " past the bound; first at " << first << ": "
                                       << got[first] << " against " << want[first] << " (bound "
                                       << factor * bound[first] << "); worst " << worst << " times the bound";
}

// Three backends on the same inputs: the CUDA backend with cuDNN attention, one with it
// switched off (the flash kernels), and the CPU's.
class CudnnAttentionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda_available(&why)) GTEST_SKIP() << "no GPU: " << why;
#ifdef PIPETRAIN_HAVE_CUDA
    try {
      (void)cuda::cudnn();
    } catch (const Error& e) {
      GTEST_SKIP() << "no cuDNN: " << e.what();
    }
#endif
    const char* set = std::getenv(kSwitch);
    const std::string saved = set != nullptr ? set : "";
    ::unsetenv(kSwitch);
    cudnn_ = make_cuda_backend();
    ::setenv(kSwitch, "0", 1);
    flash_ = make_cuda_backend();
    if (set != nullptr)
      ::setenv(kSwitch, saved.c_str(), 1);
    else
      ::unsetenv(kSwitch);
    cpu_ = make_cpu_backend();
  }
  std::unique_ptr<Backend> cudnn_, flash_, cpu_;
};

TEST_F(CudnnAttentionTest, MatchesTheFlashKernelsAndTheCpu) {
  // Bound: cuDNN rounds P, dO, dS, GQA's per-head dK and dV and its outputs to bf16 and takes D from its bf16 O: at
  // most 6u (u = 2^-9) times ref::attention_bf16_bounds' bound (the CPU: 4u, flash: 0), plus f32's share.
  const double u = std::ldexp(1.0, -9);
  for (Shape s : {Shape{1, 1024, 8, 2, 128}, Shape{1, 1024, 8, 2, 64}, Shape{2, 200, 8, 2, 64},
                  Shape{2, 200, 8, 2, 128}, Shape{2, 256, 4, 4, 64}}) {
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " NH=" << s.NH << " NKV=" << s.NKV
                                      << " hs=" << s.hs);
    const Inputs in = inputs(s, 90);
    DVec out_bound, dqkv_bound;
    ref::attention_bf16_bounds(out_bound, dqkv_bound, in.dout, in.wide, s.B, s.T, s.C(), s.NH, s.NKV);
    const Result c = run(*cudnn_, in, s), f = run(*flash_, in, s), p = run(*cpu_, in, s);
    ASSERT_TRUE(c.cudnn) << "the forward ran on the flash kernels; the backend printed: " << c.log;
    const bool unpadded = cudnn_version() < 91600 && s.T % 128 != 0;  // then its backward is refused: no padding mask
    EXPECT_TRUE(unpadded || c.log.find("cuDNN refuses") == std::string::npos) << c.log;  // the backward on cuDNN too
    EXPECT_FALSE(f.cudnn) << kSwitch << "=0 left cuDNN on";
    const double f32 = std::max(s.T, s.hs) * std::ldexp(1.0, -23);  // sums of up to T terms, dot products of hs
    EXPECT_TRUE(within(c.out, f.out, out_bound, 6 * u + 2 * f32)) << "out against the flash kernels";
    EXPECT_TRUE(within(c.dqkv, f.dqkv, dqkv_bound, 6 * u + 2 * f32)) << "dqkv against the flash kernels";
    EXPECT_TRUE(within(c.out, p.out, out_bound, 10 * u + 2 * f32)) << "out against the CPU";
    EXPECT_TRUE(within(c.dqkv, p.dqkv, dqkv_bound, 10 * u + 2 * f32)) << "dqkv against the CPU";
  }
}

// What cuDNN is not asked for runs on the flash kernels: the same bits as the backend that
// has cuDNN switched off. And a cuDNN stash's backward refuses f32 qkv.
TEST_F(CudnnAttentionTest, CallsItIsNotAskedForRunOnTheFlashKernels) {
  const Shape s{1, 128, 4, 2, 64}, odd{1, 70, 4, 2, 12};  // cuDNN takes s; odd's head size is not a multiple of 8
  const Inputs in = inputs(s, 95), in_odd = inputs(odd, 97);
  std::vector<int32_t> positions(s.T);
  for (int t = 0; t < s.T; ++t) positions[t] = t < 50 ? t : t - 50;  // two documents
  struct Case {
    const char* what;
    const Inputs& in;
    Shape shape;
    Options options;
  };
  for (const Case& k :
       {Case{"f32 qkv", in, s, {DType::BF16, nullptr, true}}, Case{"f32 storage", in, s, {DType::F32, nullptr, false}},
        Case{"packed documents", in, s, {DType::BF16, &positions, false}}, Case{"head size 12", in_odd, odd, {}}}) {
    SCOPED_TRACE(k.what);
    const Result c = run(*cudnn_, k.in, k.shape, k.options), f = run(*flash_, k.in, k.shape, k.options);
    EXPECT_FALSE(c.cudnn);
    EXPECT_TRUE(testing::close(c.out, f.out, 0, 0));
    EXPECT_TRUE(testing::close(c.dqkv, f.dqkv, 0, 0));
  }
  EXPECT_TRUE(run(*cudnn_, in, s).cudnn) << "the shape the cases above share is cuDNN's";

  auto pool = MemoryPool::create(*cudnn_);
  DevBuf<bf16> half(*cudnn_, in.qkv);
  DevBuf<float> wide(*cudnn_, in.wide), dout(*cudnn_, in.dout), out(*cudnn_, in.dout), dq(*cudnn_, in.wide);
  const bf16* q = half.get();
  auto stash = cudnn_->attention_forward(out.get(), q, s.B, s.T, s.C(), s.NH, s.NKV, *pool, DType::BF16);
  ASSERT_TRUE(on_cudnn(*stash));
  try {
    cudnn_->attention_backward(dq.get(), dout.get(), static_cast<const float*>(wide.get()), *stash, s.B, s.T, s.C(),
                               s.NH, s.NKV, *pool);
    ADD_FAILURE() << "a cuDNN stash's backward took f32 qkv";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bf16 qkv"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pipetrain
