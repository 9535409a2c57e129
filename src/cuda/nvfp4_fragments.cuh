// Device helpers shared by the NVFP4 tensor-core kernels: the BF16 mma.sync, BF16 pair multiplies and
// E4M3 block scales → BF16 pairs; the codes decode with nvfp4_layout.h's decode_code_word.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/nvfp4_layout.h"

namespace nibble::cuda {

// d += a · b on BF16 tensor cores, m16n8k16, fp32 accumulation. Fragments (g = lane / 4, c = lane % 4):
// a0 (row g, k 2c..2c+1), a1 (row g+8, same k), a2 (row g, k 2c+8..9), a3 (row g+8, k 2c+8..9);
// b0 (k 2c..2c+1, column g), b1 (k 2c+8..9, column g); d (row g | g+8, column 2c | 2c+1).
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  const __nv_bfloat162 r = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&a),
                                   *reinterpret_cast<const __nv_bfloat162*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}

// An E4M3 block scale (non-negative) → BF16 pair of scale × 2^DECODED_SCALE_EXPONENT, the operand that
// turns a decoded pair into weight × 2⁻⁸ (nvfp4_layout.h). Its bits eeee mmm at fp32 bits 26..20 give
// the value × 2⁻¹²⁰ (subnormals as fp32 subnormals), × 2¹²⁰ and × 2¹¹⁸ in fp32 (exact: no flush, built
// without ftz; ≤ 448 · 2¹¹⁸ < 2¹²⁸), then the top half of the fp32 bits (exact: ≤ 4 significant bits).
__device__ __forceinline__ uint32_t e4m3_scale_bf16x2(uint32_t byte) {
  static_assert(DECODED_SCALE_EXPONENT == 118);
  const float scale = __uint_as_float((byte & 0x7Fu) << 20) * 0x1p120f;
  const uint32_t bits = __float_as_uint(scale * 0x1p118f) >> 16;
  return bits | bits << 16;
}

}  // namespace nibble::cuda
