// Grouped NVFP4 GEMMs of the MoE layer on BF16 tensor cores: gate_up with SwiGLU in the epilogue
// (gate and up each with their own weight_scale_2) and down. Rows are the expert-sorted (token,
// slot) pairs from group_by_expert; each CTA computes one tile of one expert. Twin of the
// per-expert projections in ref::moe.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace nibble::cuda {

// One projection of every expert, stacked in expert order as the checkpoint's per-expert tensors are.
struct DeviceNvfp4Experts {
  const uint8_t* packed = nullptr;        // [experts, rows, cols/2], repacked (repack_nvfp4)
  const uint8_t* block_scales = nullptr;  // [experts, rows, cols/16] scale codes (repack_nvfp4)
  const float* global_scales = nullptr;   // device [experts]: each expert's weight_scale_2
  int64_t experts = 0, rows = 0, cols = 0;
};

struct GroupedGemmArgs {
  const uint16_t* act = nullptr;          // BF16 [source rows, K]: x (or x̂) for gate_up, the SwiGLU output for down
  const int32_t* sorted_pairs = nullptr;  // gate_up: sorted row r reads source row sorted_pairs[r] / top_k; null: row r
  int64_t top_k = 1;
  const float* row_scales = nullptr;        // W4A4: per source row (token scale or input_scale); null for W4A16
  const int32_t* expert_offsets = nullptr;  // from group_by_expert run with tile_rows
  const int32_t* tile_offsets = nullptr;
  const int4* tiles = nullptr;  // the tile list (ExpertGroups::tiles)
  int tile_rows = 0;            // moe_tile_rows(...) for this batch
  int64_t pairs = 0;            // tokens · top_k
  void* out = nullptr;          // [pairs, out features] in sorted-row order
  bool out_fp32 = false;        // fp32 output (the W4A4 modes re-quantize it) instead of BF16
  // wgmma only (nvfp4_wgmma.cuh): act's columns / out's (BF16) columns in fragment order (nvfp4_layout.h).
  bool act_fragment_order = false, out_fragment_order = false;
};

// The tile height (rows per CTA) the grouped GEMMs use for this batch and these in_features (hidden
// for gate_up, intermediate for down); group_by_expert must use it.
int moe_tile_rows(int64_t pairs, int64_t experts, int64_t hidden, int64_t intermediate);

// out[r, i] = silu(g) · u, g = row_scale · gate_scale_e · (a_r · Ĝ_e[i]), u likewise with up's scale.
Status moe_gemm_gate_up(const GroupedGemmArgs& args, const DeviceNvfp4Experts& gate, const DeviceNvfp4Experts& up,
                        cudaStream_t stream);

// out[r, n] = row_scale · down_scale_e · (a_r · D̂_e[n]).
Status moe_gemm_down(const GroupedGemmArgs& args, const DeviceNvfp4Experts& down, cudaStream_t stream);

}  // namespace nibble::cuda
