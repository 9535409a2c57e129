// The GPU layout of NVFP4 weights, made once at load (repack_nvfp4): every 32-bit word keeps the
// checkpoint's eight codes (k 8w … 8w + 7 of its row) but moves their bits so that E2M1 → BF16 is one
// or two shifts and masks per pair of codes, and every E4M3 block scale becomes a one-byte scale code
// whose BF16 operand is one multiply-add, with no tables (docs/format.md). Plain C++ (host and
// device), so the CPU tests check the layout against the codecs.
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

// Scale codes. Every non-zero E4M3 magnitude is 2^E · (1 + f/8) with E in [-9, 8] (subnormals
// normalized) and a 3-bit f; its code is (E + 10) << 3 | f (8 … 150), so the BF16 bits of
// scale × 2¹¹⁸ are code · 16 + SCALE_OPERAND_BIAS (exponent field E + 245 in [236, 253]) — one
// multiply-add, or two with the byte's extraction, against six operations decoding E4M3 itself.
// The code has no sign and no zero: a block with a negative scale gets its sixteen codes' signs
// flipped (−c · s = c · −s), one with a zero scale all-zero codes (its weights are ±0 either way);
// NaN (E4M3 0x7F / 0xFF) becomes SCALE_CODE_NAN, whose operand is a BF16 NaN.
inline constexpr uint32_t SCALE_OPERAND_BIAS = uint32_t(DECODED_SCALE_EXPONENT + 127 - 10) << 7;  // 235 << 7
inline constexpr uint8_t SCALE_CODE_NAN = 20u << 3 | 7u;

// A non-zero, non-NaN E4M3 magnitude (sign bit clear) → its scale code.
NIB_HD uint8_t scale_code(uint8_t magnitude) {
  const int e = magnitude >> 3, m = magnitude & 7;
  if (e > 0) return uint8_t(magnitude + 24);  // (e - 7 + 10) << 3 | m
  const int p = m >= 4 ? 2 : m >= 2 ? 1 : 0;  // m · 2⁻⁹ = 2^(p - 9) · (m / 2^p)
  return uint8_t((p + 1) << 3 | ((m << (3 - p)) & 7));
}

// The BF16 bits (low 16) of a scale code's operand, scale × 2¹¹⁸.
NIB_HD uint32_t scale_operand_bits(uint32_t code) { return code * 16u + SCALE_OPERAND_BIAS; }

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

// Pair P (known at compile time) of a repacked word as a BF16 pair (E2M1 × 2⁻¹²⁶): pairs 1 and 2 one
// shift and one mask, pairs 0 and 3 two of each.
template <int P>
NIB_HD uint32_t decode_code_pair_at(uint32_t w) {
  static_assert(P >= 0 && P < 4, "a word holds four pairs");
  if constexpr (P == 0) return ((w << 6) & DECODED_MAGNITUDE_BITS) | ((w << 2) & DECODED_SIGN_BITS);
  if constexpr (P == 1) return (w << 3) & DECODED_BITS;
  if constexpr (P == 2) return w & DECODED_BITS;
  if constexpr (P == 3) return ((w >> 3) & DECODED_MAGNITUDE_BITS) | ((w << 1) & DECODED_SIGN_BITS);
}

// The same for a pair index the compiler knows after unrolling (a loop counter).
NIB_HD uint32_t decode_code_pair_unrolled(uint32_t w, int p) {
  return p == 0   ? decode_code_pair_at<0>(w)
         : p == 1 ? decode_code_pair_at<1>(w)
         : p == 2 ? decode_code_pair_at<2>(w)
                  : decode_code_pair_at<3>(w);
}

// A repacked word → its four pairs as BF16 pairs: six masks, five shifts.
NIB_HD void decode_code_word(uint32_t w, uint32_t (&pair)[4]) {
  pair[0] = decode_code_pair_at<0>(w);
  pair[1] = decode_code_pair_at<1>(w);
  pair[2] = decode_code_pair_at<2>(w);
  pair[3] = decode_code_pair_at<3>(w);
}

// One 16-code block of the checkpoint (its two code words and its E4M3 scale) → the GPU layout.
NIB_HD void repack_block(uint32_t& word0, uint32_t& word1, uint8_t& scale) {
  const uint8_t magnitude = scale & 0x7Fu;
  if (magnitude == 0) {
    word0 = word1 = 0, scale = 0;
    return;
  }
  if (magnitude == 0x7Fu) {
    scale = SCALE_CODE_NAN;
  } else {
    if (scale & 0x80u) word0 ^= 0x88888888u, word1 ^= 0x88888888u;  // every code's sign bit
    scale = scale_code(magnitude);
  }
  word0 = repack_code_word(word0), word1 = repack_code_word(word1);
}

// Line order (expert weights whose in_features are a multiple of 128): inside each 128-wide k-block
// of a row, the sixteen code words as a 4 × 4 matrix transposed, so stored word 4c + q holds k
// 32q + 8c … + 7; the scale codes keep their order. The skinny kernels' lane c of a row then reads its
// 16 code bytes as before while its x loads, k 32q + 8c … + 7, are whole lines across the four lanes
// (H200, MoE block T = 128 173 → 149 µs; docs/lab/perf-notebook.md, "The skinny MoE's activation loads as whole
// lines"). A 64-wide half-block (a wgmma stage) is bytes 8h … 8h + 7 of each lane's 16.
NIB_HD bool expert_line_order(int64_t in_features) { return in_features % 128 == 0; }
// The k-chunk (8 codes) of stored word s (0 … 15) of a block; the transpose is its own inverse.
NIB_HD int line_order_chunk(int s) { return 4 * (s & 3) + (s >> 2); }

// Fragment order (the wgmma MoE kernels' activations; docs/format.md): inside every 32-element group
// of a row, the 4 × 4 matrix of BF16 pairs [8-element chunk c][pair i] transposed, so element k of a
// row sits at fragment_order_index(k). A wgmma A fragment's thread q holds pair q of each 8-slot chunk
// of B's k order, and with B's k order in fragment order those are pairs i = 0 … 3 of natural chunk
// 4·(group) + q: whole code words, which decode with compile-time pair positions (decode_code_pair_at)
// instead of run-time rotations. The transpose is its own inverse.
NIB_HD int64_t fragment_order_index(int64_t k) {
  const int64_t chunk = (k / 8) % 4, pair = (k / 2) % 4;
  return k / 32 * 32 + pair * 8 + chunk * 2 + k % 2;
}

// Pair p alone, given its two rotations (p known only at run time: each lane of the wgmma kernels
// takes one pair of every word, and computes its rotations once).
NIB_HD uint32_t decode_code_pair(uint32_t w, int magnitude_rotation, int sign_rotation) {
  return (rotate_left(w, magnitude_rotation) & DECODED_MAGNITUDE_BITS) |
         (rotate_left(w, sign_rotation) & DECODED_SIGN_BITS);
}

}  // namespace nibble::cuda
