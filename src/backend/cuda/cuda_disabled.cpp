// The CUDA entry points of a build without CUDA (PIPETRAIN_ENABLE_CUDA=OFF, or AUTO
// without nvcc): they exist so that callers need no #ifdef, and say how to get CUDA.
// Compiled instead of the rest of src/backend/cuda (see src/CMakeLists.txt).
#include <memory>
#include <string>

#include "pipetrain/backend/cuda.hpp"
#include "pipetrain/core/error.hpp"

namespace pipetrain {
namespace {

constexpr const char* kNotBuilt =
    "this pipetrain was built without CUDA (configure with -DPIPETRAIN_ENABLE_CUDA=ON)";

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int /*device*/) { throw Error(kNotBuilt); }

bool cuda_available(std::string* why) {
  if (why != nullptr) *why = kNotBuilt;
  return false;
}

std::string cuda_build_summary() { return "not built"; }

}  // namespace pipetrain
