// How a dense layer's fp32 products run on a CPU, and what each way costs: the vocabulary
// the backend (which times and runs them), the cost model (which chooses) and the trainer
// (which applies the choice to every rank) share.
//
// A dense layer multiplies by its weight W (out x in) three times per microbatch: the
// forward y = x W^T, the input gradient dx = dy W and the weight gradient dW += dy^T x.
// Each may run in the BLAS (OpenBLAS's sgemm, which repacks W on every call) or in oneDNN
// (its sgemm, which detects the CPU's instruction set itself); the first two may also
// multiply by a copy of W reordered once per step into oneDNN's blocked layout ("packed").
#pragma once
#include <array>
#include <string>
#include <vector>

namespace pipetrain {

enum class ProductLibrary { Blas, Onednn };
enum DenseProduct { kForward = 0, kInputGradient = 1, kWeightGradient = 2 };

struct DenseShape {
  int out = 0, in = 0;
  bool operator==(const DenseShape&) const = default;
};

// One weight shape's products at `rows` rows, seconds each (as timed; < 0: that path is
// not available here).
struct DenseProductTimes {
  DenseShape shape;
  int rows = 0;
  std::array<double, 3> blas{-1, -1, -1}, onednn{-1, -1, -1};  // by DenseProduct
  std::array<double, 2> packed{-1, -1};  // forward and input gradient by the packed copy
  double reorder = -1;                   // a step's reorders of W: into the forward's and dx's layouts
};

// The choice: a library per product, and the weight shapes kept packed for the first two.
struct DensePaths {
  std::array<ProductLibrary, 3> library{ProductLibrary::Blas, ProductLibrary::Blas, ProductLibrary::Blas};
  std::vector<DenseShape> packed;
  bool operator==(const DensePaths&) const = default;
};

const char* library_name(ProductLibrary l);            // "OpenBLAS"-style: "BLAS" or "oneDNN"
const char* product_name(DenseProduct p);              // "forward", "input gradient", "weight gradient"
ProductLibrary parse_library(const std::string& name);  // "blas" | "onednn"; Error otherwise

}  // namespace pipetrain
