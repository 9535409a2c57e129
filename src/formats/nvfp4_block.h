// One NVFP4 block of 16 activations, quantized as Blackwell kernels do it (TensorRT-LLM
// cvt_warp_fp16_to_fp4, used by FlashInfer/vLLM/SGLang): SF = e4m3(G·(amax·rcp(6))),
// out_scale = rcp(float(SF)·rcp(G)), code = e2m1(x·out_scale). Host and device.
#pragma once

#include <cstdint>

#include "formats/e2m1.h"
#include "formats/e4m3.h"
#include "formats/host_device.h"

namespace nibble::formats {

inline constexpr int NVFP4_BLOCK = 16;                     // elements per block scale, along K
inline constexpr float NVFP4_SCALE_RANGE = 6.0f * 448.0f;  // E2M1_MAX · E4M3_MAX = 2688

// Exact IEEE reciprocal: the CPU reference. The GPU kernels pass rcp.approx.ftz (as the Blackwell
// kernels do); docs/format.md states what that can change and tests/cpp bounds it.
struct ExactReciprocal {
  NIB_HD float operator()(float x) const { return 1.0f / x; }
};

// The E4M3 codec of the scale rule: e4m3.h's, host and device. GPU kernels pass the hardware's
// conversions, which give the same codes and values (cuda/nvfp4/nvfp4_act_quant.cuh).
struct SoftwareE4M3 {
  NIB_HD uint8_t encode(float x) const { return e4m3_encode(x); }
  NIB_HD float decode(uint8_t code) const { return e4m3_decode(code); }
};

// The block scale of 16 activations with block maximum amax and global scale G, and the factor that
// takes an element to E2M1 units (out_scale); 0 for an all-zero block.
template <class Reciprocal = ExactReciprocal, class E4M3 = SoftwareE4M3>
NIB_HD uint8_t activation_block_scale(float amax, float global_scale, float& out_scale, Reciprocal rcp = Reciprocal(),
                                      E4M3 e4m3 = E4M3()) {
  const float sf_value = global_scale * (amax * rcp(E2M1_MAX));
  const uint8_t sf = e4m3.encode(sf_value);
  const float sf_decoded = e4m3.decode(sf);
  out_scale = sf_decoded != 0.0f ? rcp(sf_decoded * rcp(global_scale)) : 0.0f;
  return sf;
}

// Quantizes x[0..15] with global scale G (static: 1/input_scale; per-token: 1/token_scale).
// Writes 16 E2M1 codes and returns the E4M3 block scale. Inputs must be finite; the caller checks.
template <class Reciprocal = ExactReciprocal>
NIB_HD uint8_t quantize_activation_block(const float* x, float global_scale, uint8_t* codes,
                                         Reciprocal rcp = Reciprocal()) {
  float amax = 0.0f;
  for (int i = 0; i < NVFP4_BLOCK; ++i) amax = fmaxf(amax, fabsf(x[i]));
  float out_scale;
  const uint8_t sf = activation_block_scale(amax, global_scale, out_scale, rcp);
  for (int i = 0; i < NVFP4_BLOCK; ++i) codes[i] = e2m1_encode(x[i] * out_scale);
  return sf;
}

// One block of 16 finite weights quantized as ModelOpt exports them (NVFP4QTensor): block scale
// e4m3(clamp(amax / (6·scale_2))) (1 for an all-zero block), codes from the IEEE division by
// float(scale)·scale_2 rounded as _cast_fp4 rounds, the sign from `x < 0` (so -0.0 gives code 0);
// packs the 16 codes into 8 bytes (even element in the low nibble) and returns the block scale.
// Written as plain loops over 16 lanes so the compiler vectorizes them.
NIB_HD uint8_t quantize_weight_block(const float* x, float scale_2, uint8_t* packed) {
  // amax by lane-wise halving: element-wise maxima vectorize, a running maximum would not.
  float m[NVFP4_BLOCK / 2];
  for (int i = 0; i < NVFP4_BLOCK / 2; ++i) m[i] = fabsf(x[i]) > fabsf(x[i + 8]) ? fabsf(x[i]) : fabsf(x[i + 8]);
  for (int width = NVFP4_BLOCK / 4; width >= 1; width /= 2)
    for (int i = 0; i < width; ++i) m[i] = m[i] > m[i + width] ? m[i] : m[i + width];
  const float amax = m[0];
  float s = amax / (E2M1_MAX * scale_2);
  if (s == 0.0f) s = 1.0f;
  s = s < E4M3_MIN_SUBNORMAL ? E4M3_MIN_SUBNORMAL : s > E4M3_MAX ? E4M3_MAX : s;  // _cast_per_block_scale_to_fp8
  const uint8_t sf = e4m3_encode(s);
  const float divisor = e4m3_decode(sf) * scale_2;  // scale.to(float32) * scale_2
  int32_t codes[NVFP4_BLOCK];
  for (int i = 0; i < NVFP4_BLOCK; ++i) {
    const float q = x[i] / divisor;
    const float a = fabsf(q);
    codes[i] = (q < 0.0f ? E2M1_SIGN : 0) + (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) +
               (a >= 3.5f) + (a > 5.0f);
  }
  for (int j = 0; j < NVFP4_BLOCK / 2; ++j) packed[j] = static_cast<uint8_t>(codes[2 * j] | codes[2 * j + 1] << 4);
  return sf;
}

// Per-token scale of one row: amax(row)/(448·6) (FlashInfer PR 3027). The row's G is its inverse.
NIB_HD float per_token_scale(float row_amax) { return row_amax / NVFP4_SCALE_RANGE; }
NIB_HD float per_token_global(float token_scale) {
  return token_scale > 0.0f ? 1.0f / token_scale : 0.0f;  // an all-zero row quantizes to zeros
}

}  // namespace nibble::formats
