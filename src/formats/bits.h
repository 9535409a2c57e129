// Bit casts between float and uint32 usable on host and device (std::bit_cast is not device code).
#pragma once

#include <cstdint>
#include <cstring>

#include "formats/host_device.h"

namespace nibble::formats {

NIB_HD uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

NIB_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

}  // namespace nibble::formats
