// dtype_size() and dtype_name() of pipetrain/core/dtype.hpp.
#include "pipetrain/core/dtype.hpp"

namespace pipetrain {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::I32: return 4;
  }
  return 4;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::I32: return "i32";
  }
  return "?";
}

}  // namespace pipetrain
