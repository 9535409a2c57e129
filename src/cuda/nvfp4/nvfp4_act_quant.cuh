// The W4A4 activation block math on the device, shared by the quantize kernel and the norms that
// write x̂ beside their output: a value of a 16-value block → x̂ = e2m1 · e4m3 as BF16 (exact), with
// formats/nvfp4_block.h's scale rule and rcp.approx.ftz, as TensorRT-LLM's cvt_warp_fp16_to_fp4.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "formats/nvfp4_block.h"

namespace nibble::cuda {

struct ApproxReciprocal {
  __device__ float operator()(float x) const {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
  }
};

// e2m1_decode(e2m1_encode(v)): v rounded to the nearest E2M1 value (ties to even, saturating at 6,
// sign kept), computed on the value grid — spacing 0.5 below 2, 1 below 4, 2 up to 6 — with rint,
// whose half-to-even on that grid is the E2M1 tie rule (0.25→0, 0.75→1, 2.5→2, 5→4, ...). The
// spacing's reciprocal is selected, not divided (1.0f / step compiled to an IEEE division with its
// slow-path call for every value); both are powers of two, so the products are exact either way.
__device__ __forceinline__ float e2m1_round_value(float v) {
  const float a = fabsf(v);
  const bool fine = a < 2.0f, mid = a < 4.0f;
  const float step = fine ? 0.5f : mid ? 1.0f : 2.0f, per_step = fine ? 2.0f : mid ? 1.0f : 0.5f;
  return copysignf(fminf(rintf(a * per_step) * step, formats::E2M1_MAX), v);
}

// The E4M3 codec in the hardware's conversions (sm_89+ cvt.rn.satfinite: formats::e4m3_encode's round
// to nearest even and saturation, NaN to 0x7F; the decode exact through f16), where the software
// codec took ~30 dependent instructions a block scale.
struct HardwareE4M3 {
  __device__ uint8_t encode(float x) const { return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3); }
  __device__ float decode(uint8_t code) const { return __half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3))); }
};

// A block's scales from its amax under the global scale G: x̂ = e2m1_round(v · out_scale) · block_scale.
struct ActBlockScale {
  float out_scale, block_scale;
  ActBlockScale() = default;  // for scales another thread computed (shuffled in)
  __device__ ActBlockScale(float amax, float global) {
    const HardwareE4M3 e4m3;
    block_scale = e4m3.decode(formats::activation_block_scale(amax, global, out_scale, ApproxReciprocal(), e4m3));
  }
  // x̂ of v as BF16 bits: e2m1 · e4m3 has at most 6 significant bits, exact in BF16 (the truncation drops zeros).
  __device__ uint32_t bf16(float v) const {
    return __float_as_uint(e2m1_round_value(v * out_scale) * block_scale) >> 16;
  }
};

// The maximum of v over the CTA, returned to every thread (a per-token row's amax when a CTA holds the
// row). partial: blockDim.x / 32 floats of shared memory, free for reuse once every thread is here.
__device__ __forceinline__ float cta_max(float v, float* partial) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  __syncthreads();  // earlier readers of partial[] are done
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
  __syncthreads();
  for (unsigned w = 0; w < blockDim.x / 32; ++w) v = fmaxf(v, partial[w]);
  return v;
}

// The row's (global, row scale): static G = 1/input_scale, row scale input_scale; per-token
// (input_scale 0) from the row's amax, as formats::per_token_scale / per_token_global.
__device__ __forceinline__ void act_row_scales(float input_scale, float row_amax, float& global, float& row_scale) {
  if (input_scale > 0.0f) {
    row_scale = input_scale;
    global = 1.0f / input_scale;
  } else {
    row_scale = formats::per_token_scale(row_amax);
    global = formats::per_token_global(row_scale);
  }
}

// For a kernel holding a whole row per CTA (every thread calls it): the row's scales from each
// thread's share of the row's |values| (`thread_amax`, read only per-token, input_scale 0), thread 0
// storing the row scale at *row_scale_out; returns the global scale G.
__device__ __forceinline__ float cta_row_global(float input_scale, float thread_amax, float* partial,
                                                float* row_scale_out) {
  const float row_amax = input_scale == 0.0f ? cta_max(thread_amax, partial) : 0.0f;
  float global, row_scale;
  act_row_scales(input_scale, row_amax, global, row_scale);
  if (threadIdx.x == 0) *row_scale_out = row_scale;
  return global;
}

}  // namespace nibble::cuda
