// E2M1 (FP4) codec: 1 sign bit (bit 3), 2 exponent bits, 1 mantissa bit; no Inf/NaN.
// Encoding is round-to-nearest-even saturating at ±6, as PTX cvt.rn.satfinite.e2m1x2.f32 does
// (PTX ISA, "cvt"; OCP Microscaling Formats spec v1.0 §5.3.3). Host and device.
#pragma once

#include <cstdint>

#include "formats/bits.h"
#include "formats/host_device.h"

namespace nibble::formats {

inline constexpr float E2M1_MAX = 6.0f;
inline constexpr uint8_t E2M1_SIGN = 0x8;

// The value of every code 0..15; codes 8..15 are the negatives of 0..7 (8 is -0).
NIB_HD float e2m1_decode(uint8_t code) {
  constexpr float VALUES[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  return VALUES[code & 0xF];
}

// The E2M1 magnitude code (0..7) nearest to a ≥ 0 (not NaN), ties to the even code, saturating.
// Counts the midpoints below a (0.25 0.75 1.25 1.75 2.5 3.5 5): > at midpoints that round down
// (0.25→0, 1.25→1.0, 2.5→2.0, 5→4.0), >= at those that round up (0.75→1.0, 1.75→2.0, 3.5→4.0).
// Branch-free so quantization loops vectorize.
NIB_HD uint8_t e2m1_round_magnitude(float a) {
  return static_cast<uint8_t>((a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) +
                              (a > 5.0f));
}

// Round to the nearest E2M1 value, ties to the even code, saturating; keeps the sign of x
// (so -0.0 and small negatives become code 8). NaN gives +6 (code 7), as the CUDA toolkit's
// __nv_cvt_float_to_fp4 documents; callers that must reject NaN check before encoding.
NIB_HD uint8_t e2m1_encode(float x) {
  if (!(x == x)) return 7;  // NaN
  const bool negative = (float_bits(x) >> 31) != 0;
  const uint8_t magnitude = e2m1_round_magnitude(negative ? -x : x);
  return negative ? static_cast<uint8_t>(magnitude | E2M1_SIGN) : magnitude;
}

// Two codes per byte: element 2j in the low nibble, 2j+1 in the high nibble (ModelOpt
// NVFP4QTensor.quantize: `(q[..., 1::2] << 4) | q[..., 0::2]`).
NIB_HD uint8_t e2m1_pack(uint8_t even_element, uint8_t odd_element) {
  return static_cast<uint8_t>((odd_element & 0xF) << 4 | (even_element & 0xF));
}
NIB_HD uint8_t e2m1_unpack(uint8_t byte, int index_in_byte) { return index_in_byte == 0 ? (byte & 0xF) : (byte >> 4); }

}  // namespace nibble::formats
