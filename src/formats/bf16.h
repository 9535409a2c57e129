// BF16 codec: the top 16 bits of an IEEE fp32. Encoding rounds to nearest even (as torch and
// __float2bfloat16_rn do); NaN stays NaN (quiet). Host and device.
#pragma once

#include <cstdint>

#include "formats/bits.h"
#include "formats/host_device.h"

namespace nibble::formats {

NIB_HD float bf16_decode(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

NIB_HD uint16_t bf16_encode(float x) {
  const uint32_t u = float_bits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040);  // quiet NaN
  const uint32_t rounding = 0x7FFF + ((u >> 16) & 1);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

// x rounded to the nearest BF16 value, as fp32.
NIB_HD float bf16_round(float x) { return bf16_decode(bf16_encode(x)); }

}  // namespace nibble::formats
