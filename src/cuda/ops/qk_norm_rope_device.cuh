// The per-head q/k RMSNorm + RoPE of qk_norm_rope_store (transformer_ops.cu) as device code: a warp
// a head, a lane PAIRS consecutive rotation pairs, read and written as runs with vector loads and stores.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace nibble::cuda {

__device__ __forceinline__ float bf16_to_float(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}
__device__ __forceinline__ uint16_t float_to_bf16(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// N consecutive floats: 8- or 16-byte loads for N = 2 or a multiple of 4 (the host checked the alignment).
// L2: through L2 only (ld.cg), for data read before a PDL wait (no L1 line an earlier launch left).
template <int N, bool L2 = false>
__device__ __forceinline__ void load_run(const float* p, float (&out)[N]) {
  if constexpr (N == 2) {
    const float2 x = L2 ? __ldcg(reinterpret_cast<const float2*>(p)) : *reinterpret_cast<const float2*>(p);
    out[0] = x.x, out[1] = x.y;
  } else if constexpr (N % 4 == 0) {
#pragma unroll
    for (int k = 0; k < N; k += 4) {
      const float4 x = L2 ? __ldcg(reinterpret_cast<const float4*>(p + k)) : *reinterpret_cast<const float4*>(p + k);
      out[k] = x.x, out[k + 1] = x.y, out[k + 2] = x.z, out[k + 3] = x.w;
    }
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) out[k] = L2 ? __ldcg(p + k) : p[k];
  }
}

// N consecutive BF16 values (4-, 8- or 16-byte stores for N = 2, 4, 8, 16), or their fp32 form.
template <int N>
__device__ __forceinline__ void store_run(uint16_t* p, const float (&v)[N]) {
  if constexpr (N % 2 == 0) {
    uint32_t words[N / 2];
#pragma unroll
    for (int k = 0; k < N / 2; ++k)
      words[k] = uint32_t(float_to_bf16(v[2 * k])) | uint32_t(float_to_bf16(v[2 * k + 1])) << 16;
    if constexpr (N == 2)
      *reinterpret_cast<uint32_t*>(p) = words[0];
    else if constexpr (N == 4)
      *reinterpret_cast<uint2*>(p) = make_uint2(words[0], words[1]);
    else
#pragma unroll
      for (int k = 0; k < N / 2; k += 4)
        *reinterpret_cast<uint4*>(p + 2 * k) = make_uint4(words[k], words[k + 1], words[k + 2], words[k + 3]);
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) p[k] = float_to_bf16(v[k]);
  }
}
// FP8 E4M3 codes (an FP8 KV cache): round to nearest even, saturating at ±448, as formats::e4m3_encode.
template <int N>
__device__ __forceinline__ void store_run(uint8_t* p, const float (&v)[N]) {
  uint32_t codes[(N + 3) / 4] = {};
#pragma unroll
  for (int k = 0; k < N; ++k)
    codes[k / 4] |= uint32_t(__nv_cvt_float_to_fp8(v[k], __NV_SATFINITE, __NV_E4M3)) << (8 * (k % 4));
  if constexpr (N == 2)
    *reinterpret_cast<uint16_t*>(p) = uint16_t(codes[0]);
  else if constexpr (N == 4)
    *reinterpret_cast<uint32_t*>(p) = codes[0];
  else if constexpr (N == 8)
    *reinterpret_cast<uint2*>(p) = make_uint2(codes[0], codes[1]);
  else if constexpr (N == 16)
    *reinterpret_cast<uint4*>(p) = make_uint4(codes[0], codes[1], codes[2], codes[3]);
  else
#pragma unroll
    for (int k = 0; k < N; ++k) p[k] = uint8_t(codes[k / 4] >> (8 * (k % 4)));
}
template <int N>
__device__ __forceinline__ void store_run(float* p, const float (&v)[N]) {
  if constexpr (N == 2)
    *reinterpret_cast<float2*>(p) = make_float2(v[0], v[1]);
  else if constexpr (N % 4 == 0)
#pragma unroll
    for (int k = 0; k < N; k += 4) *reinterpret_cast<float4*>(p + k) = make_float4(v[k], v[k + 1], v[k + 2], v[k + 3]);
  else
#pragma unroll
    for (int k = 0; k < N; ++k) p[k] = v[k];
}

// A lane's rotation pairs of one head row: PAIRS consecutive pairs i0 … i0 + PAIRS − 1. Neox pairs
// dimensions (i, i + D/2): two runs of PAIRS values; interleaved (ERNIE-4.5) pairs (2i, 2i + 1): one
// run of 2 · PAIRS. v moves the same dimensions unrotated.
template <int PAIRS, typename T>
__device__ __forceinline__ void load_pairs(const T* row, int i0, int half, bool interleaved, float (&lo)[PAIRS],
                                           float (&hi)[PAIRS]) {
  if (interleaved) {
    float run[2 * PAIRS];
    if constexpr (sizeof(T) == 4)
      load_run<2 * PAIRS>(row + 2 * i0, run);
    else
#pragma unroll
      for (int k = 0; k < 2 * PAIRS; ++k) run[k] = bf16_to_float(row[2 * i0 + k]);
#pragma unroll
    for (int p = 0; p < PAIRS; ++p) lo[p] = run[2 * p], hi[p] = run[2 * p + 1];
  } else if constexpr (sizeof(T) == 4) {
    load_run<PAIRS>(row + i0, lo);
    load_run<PAIRS>(row + half + i0, hi);
  } else {
#pragma unroll
    for (int p = 0; p < PAIRS; ++p) lo[p] = bf16_to_float(row[i0 + p]), hi[p] = bf16_to_float(row[half + i0 + p]);
  }
}
template <int PAIRS, typename T>
__device__ __forceinline__ void store_pairs(T* row, int i0, int half, bool interleaved, const float (&lo)[PAIRS],
                                            const float (&hi)[PAIRS]) {
  if (interleaved) {
    float run[2 * PAIRS];
#pragma unroll
    for (int p = 0; p < PAIRS; ++p) run[2 * p] = lo[p], run[2 * p + 1] = hi[p];
    store_run<2 * PAIRS>(row + 2 * i0, run);
  } else {
    store_run<PAIRS>(row + i0, lo);
    store_run<PAIRS>(row + half + i0, hi);
  }
}

// One q or k head's RMSNorm (weights w_lo / w_hi of the lane's pairs; `normed` false: none) and
// RoPE (the lane's cos / sin) by a warp, in ref::rmsnorm + ref::rope_*'s fp32 order: x0 / x1 are the
// rotated lo / hi. Every lane calls it (the sum of squares is warp-wide); lanes not `active` add 0.
template <int PAIRS>
__device__ __forceinline__ void norm_rope_head(const float (&lo)[PAIRS], const float (&hi)[PAIRS], bool active,
                                               bool normed, const float (&w_lo)[PAIRS], const float (&w_hi)[PAIRS],
                                               float eps, float D, const float (&cos_p)[PAIRS],
                                               const float (&sin_p)[PAIRS], float (&x0)[PAIRS], float (&x1)[PAIRS]) {
  float inv = 1.0f;
  if (normed) {
    float sum_sq = 0.0f;
#pragma unroll
    for (int p = 0; p < PAIRS; ++p) sum_sq += active ? lo[p] * lo[p] + hi[p] * hi[p] : 0.0f;
    sum_sq = warp_sum(sum_sq);
    inv = 1.0f / sqrtf(sum_sq / D + eps);
  }
#pragma unroll
  for (int p = 0; p < PAIRS; ++p) {
    const float a = normed ? lo[p] * inv * w_lo[p] : lo[p];
    const float b = normed ? hi[p] * inv * w_hi[p] : hi[p];
    x0[p] = a * cos_p[p] - b * sin_p[p], x1[p] = b * cos_p[p] + a * sin_p[p];
  }
}

}  // namespace nibble::cuda
