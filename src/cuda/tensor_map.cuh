// Tensor maps for the copy engine (TMA, sm_90): a 2-D BF16 row-major matrix as tiles of box_rows rows
// × box_cols columns landing in the 128-byte swizzle wgmma reads, and the device side's tile copy.
// The driver's encoder is reached through the runtime's entry-point query, so nothing links libcuda.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace nibble::cuda {

// map ← the tiles of `data` (BF16 [rows, cols], row-major, 16-byte aligned; cols · 2 a multiple of 16;
// box_cols · 2 ≤ 128 bytes, box_rows ≤ 256). Reads past the last row land as zeros.
Status encode_bf16_tile_map(CUtensorMap* map, const void* data, int64_t rows, int64_t cols, int box_cols,
                            int box_rows);

// The box at (column c0, row c1) of `map` (a __grid_constant__ kernel parameter's address) → shared
// memory at `smem` (1024-byte aligned for the 128-byte swizzle), its bytes counted on the barrier at
// shared address `bar` (PTX cp.async.bulk.tensor ... mbarrier::complete_tx::bytes).
__device__ __forceinline__ void tensor_tile_to_shared(uint32_t smem, const CUtensorMap* map, int c0, int c1,
                                                      uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          smem),
      "l"(map), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

}  // namespace nibble::cuda
