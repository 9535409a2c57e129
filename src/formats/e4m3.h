// E4M3 "fn" codec (FP8 block scales): bias 7, max ±448, min subnormal 2^-9, NaN only at 0x7F/0xFF,
// no Inf (OCP 8-bit Floating Point spec v1.0, §5). Encoding is round-to-nearest-even with
// saturation to ±448 (CUDA __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)). Host and device.
#pragma once

#include <cmath>
#include <cstdint>

#include "formats/bits.h"
#include "formats/host_device.h"

namespace nibble::formats {

inline constexpr float E4M3_MAX = 448.0f;
inline constexpr float E4M3_MIN_SUBNORMAL = 1.0f / 512.0f;  // 2^-9
inline constexpr uint8_t E4M3_NAN = 0x7F;

NIB_HD float e4m3_decode(uint8_t code) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x80) << 24;
  const uint32_t exponent = (code >> 3) & 0xF;
  const uint32_t mantissa = code & 0x7;
  if (exponent == 0xF && mantissa == 0x7) return bits_float(sign | 0x7FC00000u);  // NaN
  if (exponent == 0) {
    // Subnormal: mantissa · 2^-9, exact in float.
    return bits_float(sign | float_bits(static_cast<float>(mantissa) * E4M3_MIN_SUBNORMAL));
  }
  return bits_float(sign | ((exponent - 7 + 127) << 23) | (mantissa << 20));
}

// NaN gives 0x7F (positive NaN), as the CUDA toolkit does; everything else is finite.
NIB_HD uint8_t e4m3_encode(float x) {
  const uint32_t bits = float_bits(x);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80);
  const float a = bits_float(bits & 0x7FFFFFFFu);
  if (!(a == a)) return E4M3_NAN;
  if (a >= E4M3_MAX) return sign | 0x7E;  // satfinite: everything beyond the largest finite → ±448
  if (a < 1.0f / 64.0f) {
    // Below the smallest normal 2^-6: multiples of 2^-9; a·512 is exact, rintf rounds half to even.
    return sign | static_cast<uint8_t>(rintf(a * 512.0f));  // 8 (=2^-6) carries into exponent 1
  }
  // Normal: keep 3 of the 23 mantissa bits, round half to even; a mantissa carry bumps the exponent.
  const uint32_t abits = float_bits(a);
  const uint32_t exponent = (abits >> 23) - 127 + 7;
  uint32_t mantissa = (abits & 0x7FFFFF) >> 20;
  const uint32_t rest = abits & 0xFFFFF;
  if (rest > 0x80000 || (rest == 0x80000 && (mantissa & 1))) ++mantissa;
  const uint32_t code = (exponent << 3) + mantissa;
  return sign | static_cast<uint8_t>(code > 0x7E ? 0x7E : code);
}

}  // namespace nibble::formats
