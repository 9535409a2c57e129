// The reference's dot product: 16 partial sums in a fixed order, so the compiler can keep them in
// vector registers (a single running sum is a serial chain of dependent adds that cannot vectorize
// under strict fp semantics) while every result stays the same whatever the thread count or batch.
#pragma once

#include <cstdint>

namespace nibble::ref {

inline float dot(const float* a, const float* b, int64_t n) {
  constexpr int LANES = 16;
  float acc[LANES] = {};
  int64_t k = 0;
  for (; k + LANES <= n; k += LANES)
    for (int j = 0; j < LANES; ++j) acc[j] += a[k + j] * b[k + j];
  for (int j = 0; k < n; ++k, ++j) acc[j] += a[k] * b[k];
  for (int width = LANES / 2; width >= 1; width /= 2)  // pairwise, the same tree every time
    for (int j = 0; j < width; ++j) acc[j] += acc[j + width];
  return acc[0];
}

}  // namespace nibble::ref
