// Test helpers: is a value within a few ulps of a rounding midpoint of E2M1 or E4M3? Where the GPU's
// approximate reciprocal and the CPU's exact division may disagree, they disagree only there.
#pragma once

#include <cmath>
#include <cstdint>

#include "formats/e4m3.h"

namespace nibble::test {

// rcp.approx is off by ≤ 1 ulp; three of them chained move x·scale by well under 4 ulps.
inline constexpr int BOUNDARY_ULPS = 4;

inline bool within_ulps(float value, float boundary, int ulps) {
  float lo = boundary, hi = boundary;
  for (int i = 0; i < ulps; ++i) {
    lo = std::nextafter(lo, -INFINITY);
    hi = std::nextafter(hi, INFINITY);
  }
  return value >= lo && value <= hi;
}

inline bool near_e2m1_midpoint(float v) {
  for (float m : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f})
    if (within_ulps(std::fabs(v), m, BOUNDARY_ULPS)) return true;
  return false;
}

inline bool near_e4m3_midpoint(float v) {
  for (int code = 0; code < 0x7E; ++code) {
    const float mid =
        (formats::e4m3_decode(static_cast<uint8_t>(code)) + formats::e4m3_decode(static_cast<uint8_t>(code + 1))) / 2;
    if (within_ulps(v, mid, BOUNDARY_ULPS)) return true;
  }
  return false;
}

}  // namespace nibble::test
