// Shared by the kernel harness suites: the list of backends under test and a
// device buffer mirroring a host vector (moved with Backend::allocate/copy, which for
// the CUDA backend accepts host pointers: cudaMemcpyDefault).
#pragma once
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

inline std::vector<BackendFactory> backend_factories() {
  return {{"cpu", [] { return make_cpu_backend(); }},
#ifdef PIPETRAIN_HAVE_CUDA
          {"cuda", [] { return make_cuda_backend(); }},
#endif
  };
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
