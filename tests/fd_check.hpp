// Backward kernels against central finite differences of their own forward kernels: the
// check the kernel harness suites share.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <functional>

#include "kernel_reference.hpp"

namespace pipetrain::testing {

// Central difference of L(x) = loss(x) at every element of x, compared with
// the analytic gradient: |fd - an| <= 1e-2 |an| + 2e-3 max|an|.
inline ::testing::AssertionResult fd_check(ref::Vec x, const ref::Vec& analytic,
                                           const std::function<double(const ref::Vec&)>& loss) {
  const double scale = ref::max_abs(analytic);
  for (size_t i = 0; i < x.size(); ++i) {
    const float x0 = x[i];
    const float xp = x0 + 1e-3f, xm = x0 - 1e-3f;
    x[i] = xp;
    const double lp = loss(x);
    x[i] = xm;
    const double lm = loss(x);
    x[i] = x0;
    const double fd = (lp - lm) / (static_cast<double>(xp) - xm);
    if (!(std::abs(fd - analytic[i]) <= 1e-2 * std::abs(analytic[i]) + 2e-3 * scale)) {
      return ::testing::AssertionFailure()
             << "element " << i << ": finite difference " << fd << " analytic " << analytic[i]
             << " (max |grad| " << scale << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace pipetrain::testing
