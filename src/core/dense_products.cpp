// The names of pipetrain/core/dense_products.hpp.
#include "pipetrain/core/dense_products.hpp"

#include "pipetrain/core/error.hpp"

namespace pipetrain {

const char* library_name(ProductLibrary l) { return l == ProductLibrary::Onednn ? "oneDNN" : "BLAS"; }

const char* product_name(DenseProduct p) {
  switch (p) {
    case kForward: return "forward";
    case kInputGradient: return "input gradient";
    case kWeightGradient: return "weight gradient";
  }
  return "?";
}

ProductLibrary parse_library(const std::string& name) {
  if (name == "blas") return ProductLibrary::Blas;
  if (name == "onednn") return ProductLibrary::Onednn;
  fail("unknown product library \"{}\" (expected \"blas\" or \"onednn\")", name);
}

}  // namespace pipetrain
