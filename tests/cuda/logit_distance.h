// How far two runs' logits are apart, row by row ([rows, vocab] flattened): the measures the GPU
// model tests state their tolerances in.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace nibble::test {

// Max over rows of max|a − b| / max|b|.
inline double row_error(const std::vector<float>& a, const std::vector<float>& b, int64_t vocab) {
  double worst = 0;
  for (size_t r = 0; r * vocab < b.size(); ++r) {
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      diff = std::max(diff, std::fabs(double(a[r * vocab + i]) - b[r * vocab + i]));
      scale = std::max(scale, std::fabs(double(b[r * vocab + i])));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

// Mean over rows of ‖a − b‖₂ / ‖b‖₂.
inline double mean_l2(const std::vector<float>& a, const std::vector<float>& b, int64_t vocab) {
  double total = 0;
  size_t rows = 0;
  for (size_t r = 0; r * vocab < b.size(); ++r, ++rows) {
    double diff = 0, norm = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      const double d = double(a[r * vocab + i]) - b[r * vocab + i];
      diff += d * d;
      norm += double(b[r * vocab + i]) * b[r * vocab + i];
    }
    total += std::sqrt(diff / norm);
  }
  return total / double(rows);
}

}  // namespace nibble::test
