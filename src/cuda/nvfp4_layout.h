// The GPU layout of NVFP4 weight codes, made once at load (repack_nvfp4_codes): every 32-bit word
// keeps the checkpoint's eight codes (k 8w … 8w + 7 of its row) but moves their bits so that
// E2M1 → BF16 is one or two shifts and masks per pair of codes, with no tables (docs/format.md).
// Plain C++ (host and device), so the CPU tests check the layout against the codec.
#pragma once

#include <cstdint>

#include "formats/host_device.h"

namespace nibble::cuda {

// Pair p of a word is elements 2p (the low BF16 half) and 2p + 1 (the high half). Element 2p's
// magnitude bits (code & 7: e1 e0 m, m lowest) sit at bits 3p … 3p + 2 and its sign at
// pair_sign_bit(p) (13, 12, 15, 14); element 2p + 1's at the same places + 16. Decoding moves a
// pair's magnitudes to BF16 bits 6 … 8 and 22 … 24 (the lowest exponent bits and the top mantissa
// bit) and its signs to bits 15 and 31: the BF16 value is the E2M1 value × 2⁻¹²⁶ exactly (code 1,
// 0.5, becomes the BF16 subnormal 2⁻¹²⁷; e ≥ 1 gives 2^(e-127)·(1 + m/2) against E2M1's
// 2^(e-1)·(1 + m/2)). The sign bits are placed so pairs 1 and 2 need one shift and one mask, pairs 0
// and 3 two of each — the fewest a search over all such layouts found (no layout gives every pair a
// single shift).
inline constexpr uint32_t DECODED_MAGNITUDE_BITS = 0x01C001C0u, DECODED_SIGN_BITS = 0x80008000u;
inline constexpr uint32_t DECODED_BITS = DECODED_MAGNITUDE_BITS | DECODED_SIGN_BITS;
// Left rotations that bring pair p's magnitudes / signs into place: 6, 3, 0, 29 (a right shift by
// 3) and 2, 3, 0, 1.
NIB_HD int pair_magnitude_rotation(int p) { return (6 - 3 * p) & 31; }
NIB_HD int pair_sign_rotation(int p) { return (p + 2) & 3; }
NIB_HD int pair_sign_bit(int p) { return 15 - pair_sign_rotation(p); }

// Decoded code × block scale is the weight × 2⁻⁸: the BF16 scale operand carries scale × 2¹¹⁸
// (2¹²⁶ would overflow BF16 at 448), so every product is a normal BF16, exact (≤ 6 significant bits),
// and GEMM epilogues multiply by WEIGHT_DECODE_EPILOGUE (a power of two: the results are the same bits).
inline constexpr int DECODED_SCALE_EXPONENT = 118;
inline constexpr float WEIGHT_DECODE_EPILOGUE = 256.0f;

// The checkpoint's word (element j in bits 4j … 4j + 3) → the GPU layout.
NIB_HD uint32_t repack_code_word(uint32_t word) {
  uint32_t out = 0;
  for (int p = 0; p < 4; ++p)
    for (int half = 0; half < 2; ++half) {
      const uint32_t code = (word >> (4 * (2 * p + half))) & 0xFu;
      out |= (code & 7u) << (16 * half + 3 * p) | (code >> 3) << (16 * half + pair_sign_bit(p));
    }
  return out;
}

NIB_HD uint32_t rotate_left(uint32_t x, int n) {
#if defined(__CUDA_ARCH__)
  return __funnelshift_l(x, x, n);
#else
  return n == 0 ? x : (x << n) | (x >> (32 - n));
#endif
}

// A repacked word → its four pairs as BF16 pairs (E2M1 × 2⁻¹²⁶): six masks, five shifts.
NIB_HD void decode_code_word(uint32_t w, uint32_t (&pair)[4]) {
  pair[0] = ((w << 6) & DECODED_MAGNITUDE_BITS) | ((w << 2) & DECODED_SIGN_BITS);
  pair[1] = (w << 3) & DECODED_BITS;
  pair[2] = w & DECODED_BITS;
  pair[3] = ((w >> 3) & DECODED_MAGNITUDE_BITS) | ((w << 1) & DECODED_SIGN_BITS);
}

// Pair p alone, given its two rotations (p known only at run time: each lane of the wgmma kernels
// takes one pair of every word, and computes its rotations once).
NIB_HD uint32_t decode_code_pair(uint32_t w, int magnitude_rotation, int sign_rotation) {
  return (rotate_left(w, magnitude_rotation) & DECODED_MAGNITUDE_BITS) | (rotate_left(w, sign_rotation) & DECODED_SIGN_BITS);
}

}  // namespace nibble::cuda
