// NVFP4 GEMMs for few token rows (decode and small batches) on BF16 tensor cores, with no
// shared-memory staging: each warp owns one m16 tile of weight rows over a range of k and loads its
// E2M1 codes and scale codes straight into mma fragment registers, up to 16 (dense) or 32 (MoE)
// token columns come from L1-cached loads of the activations, and the CTA's warps split k and sum
// their parts in a fixed order. Dense (up to three weights sharing one input: q/k/v as one launch)
// and the MoE's gate_up (+SwiGLU) and down over the expert tile list of group_by_expert. Twins of
// ref::linear_nvfp4 and the per-expert projections of ref::moe, like the other backends.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"
#include "cuda/gemm/linear_nvfp4.cuh"
#include "cuda/moe/moe_gemm.cuh"

namespace nibble::cuda {

// in_features must be a multiple of this (one k-block: 64 code bytes and 8 scales per row) and at
// most SKINNY_MAX_K (16 warps of 4 k-blocks).
inline constexpr int64_t SKINNY_K_BLOCK = 128;
inline constexpr int64_t SKINNY_MAX_K = 16 * 4 * SKINNY_K_BLOCK;
// The MoE kernels' tiles of sorted rows are 8, 16 or 32 rows (one, two or four mma n-tiles sharing each
// decoded weight fragment); the grouping's tile list is sized for the smallest.
inline constexpr int SKINNY_MIN_TILE_ROWS = 8;
// The tile height for `pairs` rows over `experts`: 8 while experts average fewer than 4 rows, 16 below
// 16, else 32: taller tiles decode each weight for more rows, shorter ones waste fewer MMA rows (H200,
// MoE block T = 256: 32-row tiles 26% faster than 8; docs/lab/perf-notebook.md).
int skinny_moe_tile_rows(int64_t pairs, int64_t experts);

bool skinny_supported(int64_t in_features);  // the MoE kernels (one CTA spans k)
// skinny_linear: any multiple of 128 (k ranges of SKINNY_MAX_K in successive launches).
bool skinny_linear_supported(int64_t in_features);

// y_i[M, N_i] fp32 = row_scale · weight_scale_2_i · (x[M, K] · Ŵ_iᵀ) for each of `count` ≤ 3 weights
// sharing x (the same K); row_scales (device [M]) or null for 1. Any M (token tiles of 16 each
// re-read the weights, from L2 when they fit); the kernels are meant for M ≤ 64.
Status skinny_linear(const uint16_t* x, int64_t M, const DeviceNvfp4Weight* const* weights, float* const* outputs,
                     int count, const float* row_scales, cudaStream_t stream);

// skinny_linear for M ≤ SKINNY_SPLIT_MAX_M split over k (DenseKernel::SKINNY_SPLIT): CTAs of 64-128
// weight rows share their tokens' x slice in shared memory and decode each weight once for all
// tokens; the k splits of a thread-block cluster meet in distributed shared memory, added in rank
// order (deterministic). Any in_features that is a multiple of 128.
Status skinny_linear_split(const uint16_t* x, int64_t M, const DeviceNvfp4Weight* const* weights, float* const* outputs,
                           int count, const float* row_scales, cudaStream_t stream);

// One token's W4A4 y_i = x̂ · Ŵ_iᵀ with x's quantize inside the GEMM (input_scale > 0: static, folded
// into alpha; 0: per-token), bit for bit quantize_dequantize_activation_bf16 + skinny_linear; x̂ and
// the row scale also into x_hat_out / row_scale_out when not null. in_features ≤ SKINNY_MAX_K.
// linear_nvfp4 takes it for every W4A4 token on the skinny backend.
Status skinny_linear_quantizing(const uint16_t* x, const DeviceNvfp4Weight* const* weights, float* const* outputs,
                                int count, float input_scale, uint16_t* x_hat_out, float* row_scale_out,
                                cudaStream_t stream);

// The MoE projections over tiles of skinny_moe_tile_rows rows (args.tile_rows must be one of them): gate_up
// writes silu(g) · u per sorted row, down the expert outputs, both as moe_gemm_gate_up and
// moe_gemm_down define them.
Status skinny_moe_gate_up(const GroupedGemmArgs& args, const DeviceNvfp4Experts& gate, const DeviceNvfp4Experts& up,
                          cudaStream_t stream);
Status skinny_moe_down(const GroupedGemmArgs& args, const DeviceNvfp4Experts& down, cudaStream_t stream);

}  // namespace nibble::cuda
