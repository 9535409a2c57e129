// The one-launch MoE block's W4A4 quantize pieces (moe_decode.cu): x̂ of 16-value blocks held four values
// a lane by quads of lanes, and of whole BF16 rows by the CTA, bit for bit the quantize kernels'.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/moe/decode_block.cuh"
#include "cuda/nvfp4/nvfp4_act_quant.cuh"

namespace nibble::cuda::decode_block {

// The maximum of v over the four lanes of a quad (lanes 4i … 4i + 3): a 16-value block's when each
// lane holds four of its values. Every lane of the warp calls it.
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 2));
}
__device__ __forceinline__ float max_abs4(float a, float b, float c, float d) {
  return fmaxf(fmaxf(fabsf(a), fabsf(b)), fmaxf(fabsf(c), fabsf(d)));
}

// A per-token row amax without a reduction of its own: each warp publishes its maximum of the threads'
// |value| maxima before a CTA barrier the caller needs anyway (every lane calls it), and after that
// barrier every thread reads the warps' maximum. (|x| as fp32 bits: their order is the values'.)
__device__ __forceinline__ void publish_warp_amax(float thread_amax, float* warp_amax) {
  const unsigned m = __reduce_max_sync(0xFFFFFFFFu, __float_as_uint(thread_amax));
  if ((threadIdx.x & 31) == 0) warp_amax[threadIdx.x >> 5] = __uint_as_float(m);
}
__device__ __forceinline__ float warps_amax(const float* warp_amax) {
  float m = 0.0f;
  for (int w = 0; w < WARPS; ++w) m = fmaxf(m, warp_amax[w]);
  return m;
}

// x̂ (BF16 bits, two a word) of a lane's four consecutive values of a 16-value block that a quad of
// lanes holds, under the global scale G. Every lane of the warp calls it (quad_max).
__device__ __forceinline__ uint2 quantize_quad(float4 v, float global) {
  const ActBlockScale block(quad_max(max_abs4(v.x, v.y, v.z, v.w)), global);
  return make_uint2(block.bf16(v.x) | block.bf16(v.y) << 16, block.bf16(v.z) | block.bf16(v.w) << 16);
}

// x̂ of a BF16 row in shared memory, written to `out` (shared or global; may be `in`), bit for bit
// quantize_dequantize_activation_bf16 (input_scale > 0: static; 0: per-token): every thread calls it,
// a thread four values at a time (consecutive: no bank conflicts), a quad of lanes a 16-value block.
// n a multiple of 128 (whole warps in every round). Per-token: the row's amax given (known_amax ≥ 0)
// or found here. Returns the row scale.
__device__ inline float quantize_row_bf16(const uint16_t* in, uint16_t* out, int n, float input_scale, float known_amax,
                                   float* partial) {
  float thread_amax = 0.0f;
  if (input_scale == 0.0f && known_amax < 0.0f)
    for (int i = threadIdx.x; i < n / 4; i += THREADS) {
      const uint2 v = reinterpret_cast<const uint2*>(in)[i];
      thread_amax = fmaxf(thread_amax, max_abs4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xFFFF0000u),
                                                __uint_as_float(v.y << 16), __uint_as_float(v.y & 0xFFFF0000u)));
    }
  const float row_amax = input_scale != 0.0f ? 0.0f : known_amax >= 0.0f ? known_amax : cta_max(thread_amax, partial);
  float global, row_scale;
  act_row_scales(input_scale, row_amax, global, row_scale);
  if (known_amax < 0.0f) __syncthreads();  // with `out` == `in`: every amax read before the first write
  for (int i = threadIdx.x; i < n / 4; i += THREADS) {
    const uint2 v = reinterpret_cast<const uint2*>(in)[i];
    reinterpret_cast<uint2*>(out)[i] =
        quantize_quad(make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xFFFF0000u),
                                  __uint_as_float(v.y << 16), __uint_as_float(v.y & 0xFFFF0000u)),
                      global);
  }
  __syncthreads();
  return row_scale;
}

}  // namespace nibble::cuda::decode_block
