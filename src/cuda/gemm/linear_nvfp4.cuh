// Dense NVFP4 linear on Hopper: y[M, N] = row_scale · weight_scale_2 · (a[M, K] · Ŵ[N, K]ᵀ), with
// Ŵ = e2m1 · e4m3 (exact in BF16), fp32 accumulation and output. W4A16 (mode NONE): a = x (BF16),
// row_scale 1. W4A4 (STATIC, PER_TOKEN): a = x̂, the Blackwell-quantized x dequantized to BF16
// (exact), row_scale = input_scale or the token scale. Twin of ref::linear_nvfp4. Backends: GEMV (a warp per output row
// decodes the FP4 codes in registers: the small-M, memory-bound case) and CUBLAS (weights in BF16 — a copy made at
// load, or dequantized into a workspace per call — then cuBLAS; any M, and the in-house baseline); SKINNY
// (skinny_gemm.cuh: tensor cores fed from registers, for few rows) and SKINNY_SPLIT (its split-K form for up to 64
// rows); WGMMA (nvfp4_wgmma.cuh). Codes and block scales on the GPU are repacked once at load (nvfp4_layout.h).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <optional>
#include <string_view>

#include "core/kernel_choice.h"
#include "core/status.h"
#include "formats/nvfp4.h"

namespace nibble::cuda {

// An NVFP4 weight in device memory: the checkpoint's tensors, repacked by repack_nvfp4.
struct DeviceNvfp4Weight {
  const uint8_t* packed = nullptr;        // [rows, cols/2]: each 32-bit word k 8w … 8w + 7, in the GPU layout
  const uint8_t* block_scales = nullptr;  // [rows, cols/16] scale codes (nvfp4_layout.h)
  int64_t rows = 0;                       // N (out features)
  int64_t cols = 0;                       // K (in features)
  float weight_scale_2 = 1.0f;
  // The weight dequantized once (exact BF16 values, before weight_scale_2), or null: cublas
  // then dequantizes into the GemmContext's workspace at every call.
  const uint16_t* bf16 = nullptr;
};

// The checkpoint's code bytes (element 2j in the low nibble) and E4M3 block scales of `blocks` 16-code
// blocks → the GPU layout (nvfp4_layout.h), in place on `stream`: every weight passes through it once
// after it reaches the GPU.
// line_order (expert weights with expert_line_order(in_features)): blocks a multiple of 8, the rows' 128-wide k-blocks.
Status repack_nvfp4(uint8_t* packed, uint8_t* block_scales, size_t blocks, cudaStream_t stream,
                    bool line_order = false);

// The most token rows the skinny split-K kernel (skinny_gemm.cuh) takes.
inline constexpr int64_t SKINNY_SPLIT_MAX_M = 64;

struct GemmContext {
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;  // needed by CUBLAS
  uint16_t* workspace = nullptr;    // BF16 [rows · cols] for CUBLAS
  size_t workspace_elements = 0;
  uint16_t* act_workspace = nullptr;  // BF16 [M · K] for the W4A4 modes (x̂)
  float* row_scales = nullptr;        // [M] for the W4A4 modes
  size_t act_workspace_elements = 0;
};

// The fused GEMV is timed up to GEMV_MAX_M rows; AUTO picks it only up to AUTO_GEMV_MAX_M, where
// it beats cublas on the H200 (M = 1: 7.7 vs 11.5 µs on q_proj; M = 16: 56 vs 11 µs;
// docs/lab/perf-notebook.md), and cublas above.
inline constexpr int64_t GEMV_MAX_M = 16;
inline constexpr int64_t AUTO_GEMV_MAX_M = 1;
// AUTO takes the skinny tensor-core kernels (skinny_gemm.cuh) up to this many rows when in_features
// allows them, before the rules above (H200, q_proj: skinny/cublas 4.6/11.5 µs at M = 1,
// 8.9/11.3 at 32, 15.7/11.9 at 64).
inline constexpr int64_t AUTO_SKINNY_MAX_M = 32;
// Before both, AUTO takes the skinny split-K kernel (skinny_linear_split) from 17 to 40 rows (S_TG b32
// +5%, H200); above, its cluster reduction (2.5–7 µs a launch) loses to cuBLAS on the BF16 copies.
inline constexpr int64_t AUTO_SKINNY_SPLIT_MIN_M = 17;
inline constexpr int64_t AUTO_SKINNY_SPLIT_MAX_M = 40;

// Whether the fused GEMV takes this in_features (up to 8192).
bool gemv_supported(int64_t in_features);

// The backend AUTO means for M rows and in_features K (other choices are returned as they are,
// unless that kernel cannot take K or M: then AUTO's choice).
DenseKernel resolve_dense_kernel(DenseKernel backend, int64_t M, int64_t K);

// Ŵ as BF16 [rows, cols], unscaled by weight_scale_2 (so exact); line_order: an expert weight's
// (nvfp4_layout.h).
Status dequantize_nvfp4_bf16(const DeviceNvfp4Weight& w, uint16_t* out, cudaStream_t stream, bool line_order = false);

// x: [M, K] BF16 (device), y: [M, N] fp32 (device). Shape or alignment problems are errors.
// row_scales (optional, device [M]) multiply each output row (the W4A4 epilogue).
Status linear_nvfp4_w4a16(const uint16_t* x, int64_t M, const DeviceNvfp4Weight& w, float* y, DenseKernel backend,
                          const GemmContext& ctx, const float* row_scales = nullptr);

// Any activation mode: NONE is linear_nvfp4_w4a16; STATIC (input_scale > 0) and PER_TOKEN quantize
// x into ctx.act_workspace / ctx.row_scales first — unless x_quantized: a norm already wrote x̂ and
// the row scales there (add_rmsnorm's NormActQuant, with this input_scale). deferred_row_scales (optional):
// where per-token's row scales would take a pass of their own over y (the cuBLAS backend), y is left
// unscaled and *deferred_row_scales is set to ctx.row_scales for the consumer to apply (add_rmsnorm's
// delta_row_scales); null when y is complete.
Status linear_nvfp4(const uint16_t* x, int64_t M, const DeviceNvfp4Weight& w, formats::ActQuant mode, float input_scale,
                    float* y, DenseKernel backend, const GemmContext& ctx, bool x_quantized = false,
                    const float** deferred_row_scales = nullptr);

// Several weights on the same input (q, k and v): one launch where the backend is SKINNY (x
// quantized once in the W4A4 modes), else linear_nvfp4 for each. outputs[i]: [M, rows_i] fp32.
Status linear_nvfp4_shared_input(const uint16_t* x, int64_t M, const DeviceNvfp4Weight* const* weights,
                                 float* const* outputs, int count, formats::ActQuant mode, float input_scale,
                                 DenseKernel backend, const GemmContext& ctx, bool x_quantized = false);

}  // namespace nibble::cuda
