// NVFP4 × BF16 GEMMs on Hopper's warpgroup MMA (wgmma, sm_90a) for prefill-sized batches: the MoE's
// grouped gate_up (+SwiGLU) and down over the expert tile list, and the dense linear. Weights are
// decoded (exact) straight into wgmma's register operand; token rows are the N of the MMA.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"
#include "cuda/gemm/linear_nvfp4.cuh"
#include "cuda/moe/moe_gemm.cuh"

namespace nibble::cuda {

// Rows (tokens or expert-sorted pairs) per CTA, 32…256, for a batch of `rows` rows over `experts` (1
// for a dense GEMM); the MoE grouping must use it as tile_rows.
int wgmma_tile_rows(int64_t rows, int64_t experts);

// Whether the kernels take a weight of these rows (out_features) and cols (in_features): cols a
// multiple of 64.
bool wgmma_supported(int64_t rows, int64_t cols);

// Whether the MoE GEMMs over in_features take their activations in fragment order (nvfp4_layout.h):
// wherever the expert codes are in line order (expert_line_order).
bool wgmma_fragment_order(int64_t in_features);

// out = in (BF16 rows of `cols`, a multiple of 32) with every row's columns in fragment order.
Status to_fragment_order(const uint16_t* in, int64_t rows, int64_t cols, uint16_t* out, cudaStream_t stream);

// As moe_gemm_gate_up / moe_gemm_down (moe_gemm.cuh), with args.tile_rows == wgmma_tile_rows(pairs, experts).
Status wgmma_moe_gate_up(const GroupedGemmArgs& args, const DeviceNvfp4Experts& gate, const DeviceNvfp4Experts& up,
                         cudaStream_t stream);
Status wgmma_moe_down(const GroupedGemmArgs& args, const DeviceNvfp4Experts& down, cudaStream_t stream);

// y[M, N] (fp32) = row_scales[m] · weight_scale_2 · (x[M, K] · Ŵᵀ), as linear_nvfp4_w4a16.
Status wgmma_linear(const uint16_t* x, int64_t M, const DeviceNvfp4Weight& w, float* y, const float* row_scales,
                    cudaStream_t stream);

}  // namespace nibble::cuda
