// Rotary position embedding, Meta's convention: channel pairs (2i, 2i+1) of each head are
// rotated by the angle t * theta^(-2i / head_size), t the position in the sequence. The
// backward is the rotation by the opposite angle (a rotation's transpose). Angles are
// computed in double once per (position, pair). Packed documents give each row its own
// position (core/documents.hpp; context parallelism: the global one); the table covers them all.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu_kernels.hpp"

namespace pipetrain::cpu {

void rope(float* x, int B, int T, int ld, int heads, int head_size, float theta, bool inverse, int pos0,
          const int32_t* positions) {
  const int half = head_size / 2;
  int span = T;  // positions 0 .. span-1 (given positions may reach past T: context parallelism's global ones)
  if (positions)
    for (int64_t r = 0; r < static_cast<int64_t>(B) * T; ++r) span = std::max(span, positions[r] + 1);
  std::vector<float> cs(static_cast<size_t>(span) * half * 2);
  for (int t = 0; t < span; ++t)
    for (int i = 0; i < half; ++i) {
      const double angle = (pos0 + t) * std::pow(static_cast<double>(theta), -2.0 * i / head_size);
      cs[(static_cast<size_t>(t) * half + i) * 2] = static_cast<float>(std::cos(angle));
      cs[(static_cast<size_t>(t) * half + i) * 2 + 1] = static_cast<float>(inverse ? -std::sin(angle) : std::sin(angle));
    }
  const float* table = cs.data();
  Kokkos::parallel_for("pipetrain::rope", HostRange(0, static_cast<int64_t>(B) * T), [=](const int64_t row) {
    const int t = positions ? positions[row] : static_cast<int>(row % T);
    float* r = x + row * ld;
    const float* c = table + static_cast<size_t>(t) * half * 2;
    for (int h = 0; h < heads; ++h) {
      float* p = r + h * head_size;
      for (int i = 0; i < half; ++i) {
        const float a = p[2 * i], b = p[2 * i + 1], co = c[2 * i], si = c[2 * i + 1];
        p[2 * i] = a * co - b * si;
        p[2 * i + 1] = a * si + b * co;
      }
    }
  });
}

}  // namespace pipetrain::cpu
