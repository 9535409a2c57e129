// Device helpers shared by the tensor-core kernels: the BF16 mma.sync, BF16 pair packing and multiplies,
// and scale codes → BF16 pairs; the codes decode with nvfp4_layout.h's decode_code_word.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/nvfp4/nvfp4_layout.h"

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

// Two fp32 values as a BF16 pair (round to nearest even), `low` in the low half: the lower column of
// an mma fragment's register.
__device__ __forceinline__ uint32_t pack_bf16x2(float low, float high) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(low, high);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// 32-bit word i (0…3) of a 16-byte load.
__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  const __nv_bfloat162 r =
      __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&a), *reinterpret_cast<const __nv_bfloat162*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}

// Byte `byte` (0…3) of `bits`, a scale code (nvfp4_layout.h), → the BF16 pair of scale × 2¹¹⁸, the
// operand that turns a decoded pair into weight × 2⁻⁸: a byte permute and a multiply-add.
__device__ __forceinline__ uint32_t block_scale_bf16x2(uint32_t bits, int byte) {
  const uint32_t code = __byte_perm(bits, 0u, 0x4440u | unsigned(byte));  // the byte alone
  return code * 0x00100010u + (SCALE_OPERAND_BIAS | SCALE_OPERAND_BIAS << 16);
}

// A scale code's value as fp32 (the operand's BF16 × 2⁻¹¹⁸, exact: a normal fp32).
__device__ __forceinline__ float block_scale_value(uint32_t code) {
  return __uint_as_float(scale_operand_bits(code) << 16) * 0x1p-118f;
}

}  // namespace nibble::cuda
