// Device helpers shared by the NVFP4 tensor-core kernels: the BF16 mma.sync, E2M1 codes → BF16
// pairs (exact, no tables in memory) and E4M3 block scales → BF16 pairs.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

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

// PTX prmt in its default mode, where a selector nibble's bit 3 replicates the chosen byte's sign bit
// (the __byte_perm intrinsic masks that bit off).
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t select) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(select));
  return r;
}

// Eight E2M1 codes (a 32-bit word, element 0 in the low nibble) → four BF16 pairs, pair b holding
// elements 2b (low half) and 2b + 1, exact. The magnitude (low 3 bits of a code) picks the high and
// the low byte of its BF16 value from 8-byte tables; the sign comes from prmt's sign-replicate mode
// on a table of 0x80 bytes (0xFF where the code's bit 3 is set, else 0x80), bit 0 → bit 7.
__device__ __forceinline__ void e2m1x8_to_bf16(uint32_t word, uint32_t (&pair)[4]) {
  // BF16 of 0, 0.5, 1, 1.5, 2, 3, 4, 6: 0000 3F00 3F80 3FC0 4000 4040 4080 40C0.
  constexpr uint32_t HI_0_3 = 0x3F3F3F00u, HI_4_7 = 0x40404040u, LO_0_3 = 0xC0800000u, LO_4_7 = 0xC0804000u;
  const uint32_t magnitude = word & 0x77777777u;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const uint32_t select = half ? magnitude >> 16 : magnitude;
    const uint32_t sign = prmt(0x80808080u, 0x80808080u, half ? word >> 16 : word);
    const uint32_t hi = __byte_perm(HI_0_3, HI_4_7, select) | ((sign << 7) & 0x80808080u);
    const uint32_t lo = __byte_perm(LO_0_3, LO_4_7, select);
    pair[2 * half] = __byte_perm(lo, hi, 0x5140);
    pair[2 * half + 1] = __byte_perm(lo, hi, 0x7362);
  }
}

// An E4M3 block scale (non-negative) → BF16 pair: its bits eeee mmm at fp32 bits 26..20 give the
// value times 2⁻¹²⁰ (subnormals as fp32 subnormals), × 2¹²⁰ in fp32 (no flush: built without ftz),
// then the top half of the fp32 bits (exact: ≤ 4 significant bits).
__device__ __forceinline__ uint32_t e4m3_scale_bf16x2(uint32_t byte) {
  const uint32_t bits = __float_as_uint(__uint_as_float((byte & 0x7Fu) << 20) * 0x1p120f) >> 16;
  return bits | bits << 16;
}

}  // namespace nibble::cuda
