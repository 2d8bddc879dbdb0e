// merge_softmax_partials (pipetrain/comm/softmax_partials.hpp) and the default of
// Communicator::reduce_softmax_partials.
#include "pipetrain/comm/softmax_partials.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "pipetrain/comm/communicator.hpp"
#include "pipetrain/core/error.hpp"

namespace pipetrain {

void merge_softmax_partials(const float* in, float* inout, int64_t rows, int k) {
  const int64_t width = 2 + 2 * static_cast<int64_t>(k);
  for (int64_t n = 0; n < rows; ++n) {
    const float* x = in + n * width;
    float* y = inout + n * width;
    const float m = std::max(x[0], y[0]);
    // An empty partial (m = -inf: a slice of padding) weighs 0, also when both are empty.
    const float wx = x[0] == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(x[0] - m);
    const float wy = y[0] == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(y[0] - m);
    y[0] = m;
    for (int64_t j = 1; j < 2 + k; ++j) y[j] = x[j] * wx + y[j] * wy;  // s and a
    for (int64_t j = 2 + k; j < width; ++j) y[j] += x[j];               // b
  }
}

std::unique_ptr<CommRequest> Communicator::reduce_softmax_partials(const Tensor&, int, Stream&) {
  fail("the {} communicator has no user-defined reductions (the merge of softmax partials needs MPI's)", name());
}

}  // namespace pipetrain
