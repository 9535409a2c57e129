// One NVFP4 block of 16 activations, quantized as Blackwell kernels do it (TensorRT-LLM
// cvt_warp_fp16_to_fp4, used by FlashInfer/vLLM/SGLang): SF = e4m3(G·(amax·rcp(6))),
// out_scale = rcp(float(SF)·rcp(G)), code = e2m1(x·out_scale). Host and device.
#pragma once

#include <cstdint>

#include "formats/e2m1.h"
#include "formats/e4m3.h"
#include "formats/host_device.h"

namespace nibble::formats {

inline constexpr int NVFP4_BLOCK = 16;                 // elements per block scale, along K
inline constexpr float NVFP4_SCALE_RANGE = 6.0f * 448.0f;  // E2M1_MAX · E4M3_MAX = 2688

// Exact IEEE reciprocal: the CPU reference. The GPU kernels pass rcp.approx.ftz (as the Blackwell
// kernels do); docs/format.md states what that can change and tests/cpp bounds it.
struct ExactReciprocal {
  NIB_HD float operator()(float x) const { return 1.0f / x; }
};

// Quantizes x[0..15] with global scale G (static: 1/input_scale; per-token: 1/token_scale).
// Writes 16 E2M1 codes and returns the E4M3 block scale. Inputs must be finite; the caller checks.
template <class Reciprocal = ExactReciprocal>
NIB_HD uint8_t quantize_activation_block(const float* x, float global_scale, uint8_t* codes,
                                         Reciprocal rcp = Reciprocal()) {
  float amax = 0.0f;
  for (int i = 0; i < NVFP4_BLOCK; ++i) amax = fmaxf(amax, fabsf(x[i]));
  const float sf_value = global_scale * (amax * rcp(E2M1_MAX));
  const uint8_t sf = e4m3_encode(sf_value);
  const float sf_decoded = e4m3_decode(sf);
  const float out_scale = sf_decoded != 0.0f ? rcp(sf_decoded * rcp(global_scale)) : 0.0f;
  for (int i = 0; i < NVFP4_BLOCK; ++i) codes[i] = e2m1_encode(x[i] * out_scale);
  return sf;
}

// Per-token scale of one row: amax(row)/(448·6) (FlashInfer PR 3027). The row's G is its inverse.
NIB_HD float per_token_scale(float row_amax) { return row_amax / NVFP4_SCALE_RANGE; }
NIB_HD float per_token_global(float token_scale) {
  return token_scale > 0.0f ? 1.0f / token_scale : 0.0f;  // an all-zero row quantizes to zeros
}

}  // namespace nibble::formats
