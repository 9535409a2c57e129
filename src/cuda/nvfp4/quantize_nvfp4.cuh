// Device NVFP4 activation quantization (static and per-token) as Blackwell kernels do it, with the
// same approximate reciprocal (rcp.approx.ftz). Twin of formats::quantize_activation_{static,per_token}.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace nibble::cuda {

// x: [rows, cols] fp32 on the device, cols a multiple of 16. Outputs (device):
// packed [rows, cols/2] (element 2j in the low nibble), block_scales [rows, cols/16] E4M3,
// row_scales [rows] (per-token scales; unused and may be null in static mode).
// Static mode when input_scale > 0 (G = 1/input_scale); per-token mode when input_scale == 0.
Status quantize_activation_nvfp4(const float* x, int64_t rows, int64_t cols, float input_scale, uint8_t* packed,
                                 uint8_t* block_scales, float* row_scales, cudaStream_t stream);

// The fused "quantize, then dequantize to BF16" form the W4A4 modes use on Hopper: x [rows, cols]
// BF16 → x̂ = e2m1 · e4m3 as BF16 (exact, unscaled by the global scale) and row_scales[rows] (the
// token scale in per-token mode, input_scale in static mode), so y = row_scale · weight_scale_2 ·
// (x̂ · Ŵ). Twin of what ref::linear_nvfp4 does to its input in the STATIC and PER_TOKEN modes.
Status quantize_dequantize_activation_bf16(const uint16_t* x, int64_t rows, int64_t cols, float input_scale,
                                           uint16_t* x_hat, float* row_scales, cudaStream_t stream);
// Per-token mode with each row's amax given (row_amax [rows], device): a tensor-parallel rank's slice
// of a row quantized with the whole row's amax, which the ranks exchange (an all-reduce max of
// row_amax_bf16's), so the split linear keeps one GPU's numerics.
Status quantize_dequantize_activation_bf16_of_amax(const uint16_t* x, int64_t rows, int64_t cols,
                                                   const float* row_amax, uint16_t* x_hat, float* row_scales,
                                                   cudaStream_t stream);
// amax[r] = max |x[r, :]| (x BF16 [rows, cols], cols a multiple of 16).
Status row_amax_bf16(const uint16_t* x, int64_t rows, int64_t cols, float* amax, cudaStream_t stream);
// The same from fp32 input (the MoE down projection re-quantizes the fp32 SwiGLU output, as the
// reference does). fragment_order: x̂'s columns in fragment order (nvfp4_layout.h; cols a multiple of
// 32), the wgmma MoE down's input; the blocks quantized are the natural ones either way.
Status quantize_dequantize_activation_f32(const float* x, int64_t rows, int64_t cols, float input_scale,
                                          uint16_t* x_hat, float* row_scales, cudaStream_t stream,
                                          bool fragment_order = false);

}  // namespace nibble::cuda
