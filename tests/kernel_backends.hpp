// Shared by the kernel harness suites: the list of backends under test, the fixture
// that gives each test instance its backend, a device buffer mirroring a host vector
// (moved with Backend::allocate/copy, which for the CUDA backend accepts host pointers:
// cudaMemcpyDefault) and the elementwise comparison with the reference.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/backend/cuda.hpp"

namespace pipetrain::testing {

struct BackendFactory {
  std::string name;
  std::function<std::unique_ptr<Backend>()> make;
};

inline void PrintTo(const BackendFactory& f, std::ostream* os) { *os << f.name; }

inline std::string factory_name(const ::testing::TestParamInfo<BackendFactory>& info) { return info.param.name; }

// One backend per test instance; the CUDA instances skip with the reason when there is no GPU.
class BackendTest : public ::testing::TestWithParam<BackendFactory> {
 protected:
  void SetUp() override {
    std::string why;
    if (GetParam().name == "cuda" && !cuda_available(&why)) GTEST_SKIP() << "no GPU: " << why;
    be_ = GetParam().make();
  }
  Backend& be() { return *be_; }
  std::unique_ptr<Backend> be_;
};

// |got - want| <= atol + rtol * |want| everywhere (NaN fails).
template <class R>
::testing::AssertionResult close(const std::vector<float>& got, const R& want, double rtol, double atol) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "size mismatch";
  size_t bad = 0, first = 0;
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double w = static_cast<double>(want[i]);
    const double err = std::abs(static_cast<double>(got[i]) - w);
    if (!(err <= atol + rtol * std::abs(w))) {
      if (bad++ == 0) first = i;
      worst = std::max(worst, std::isnan(err) ? INFINITY : err);
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << got.size() << " mismatch; first at " << first << ": got "
         << got[first] << " want " << static_cast<double>(want[first]) << "; worst err " << worst;
}

// The CPU backend once per bf16 product path it can take here (bf16_products.hpp): sgemm
// on widened operands always, oneDNN where it is built in and runs bf16 on this CPU.
inline std::vector<BackendFactory> backend_factories() {
  std::vector<BackendFactory> f = {{"cpu", [] { return make_cpu_backend(Bf16Products::kSgemm); }}};
  if (onednn_bf16_usable()) f.push_back({"cpu_onednn", [] { return make_cpu_backend(Bf16Products::kOnednn); }});
#ifdef PIPETRAIN_HAVE_CUDA
  f.push_back({"cuda", [] { return make_cuda_backend(); }});
#endif
  return f;
}

// A device buffer that mirrors a host vector.
template <class T>
class DevBuf {
 public:
  DevBuf(Backend& be, const std::vector<T>& host) : be_(be), n_(host.size()) {
    p_ = static_cast<T*>(be_.allocate(bytes()));
    if (n_ != 0) be_.copy(p_, host.data(), bytes());  // upload
  }
  ~DevBuf() { be_.deallocate(p_, bytes()); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  T* get() { return p_; }
  std::vector<T> host() const {  // download
    std::vector<T> h(n_);
    if (n_ != 0) be_.copy(h.data(), p_, bytes());
    return h;
  }

 private:
  size_t bytes() const { return n_ * sizeof(T); }
  Backend& be_;
  size_t n_;
  T* p_ = nullptr;
};

}  // namespace pipetrain::testing
