// The wgmma GEMM's shapes and parameters: tile constants, the shared-memory layout of its ring of
// stages, the launch parameters, and which weight row a consumer thread's local row is. Part of the
// kernel in nvfp4_wgmma_kernel.cuh (one translation unit, nvfp4_wgmma.cu, includes these).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace nibble::cuda {
namespace {

constexpr int BK = 64;  // k per stage: one 128-byte swizzled row of BF16 activations
// WG consumer warpgroups (two, or three on 128-row tiles: more warps to hide the decode's latency),
// one m-tile of 64 weight rows each.
template <int WG>
constexpr int CONSUMER_THREADS = 128 * WG;
constexpr int PRODUCERS = 128;  // one warpgroup of copy issuers
// Weight rows per CTA: one m-tile of 64 a consumer warpgroup. (Two m-tiles a warpgroup bring 30% fewer
// bytes a k-step for the same MMAs but double the decode a token; they lost end to end: launch() in
// nvfp4_wgmma.cu.)
template <int WG = 2>
constexpr int BM = 64 * WG;
// Tiles of ≤ 64 rows run two CTAs an SM: twice the warps to hide the decode's latency and one CTA's
// pipeline fill behind the other's work (H200, MoE block T = 64 / 128 with 32-row tiles: 372 → 290
// and 374 → 294 µs; T = 512 with 64-row tiles: 421 → 351).
template <int N>
constexpr int CTAS_PER_SM = N <= 64 ? 2 : 1;
// setmaxnreg (multiples of 8) moves registers between a CTA's warps: one CTA an SM, 128 · (72 + 2 · 216)
// = 64,512 = the 384 · 168 it launches with; two, 128 · (48 + 2 · 96) = 30,720 = 384 · 80; three
// consumer warpgroups, 128 · (56 + 3 · 152) = 65,536 = 512 · 128. The producer takes all the
// consumers leave: its per-item offsets and sources stay in registers.
template <int CTAS, int WG = 2>
constexpr int PRODUCER_REGISTERS = WG == 3     ? 56
                                   : CTAS == 1 ? 72
                                               : 48;
template <int CTAS, int WG = 2>
constexpr int CONSUMER_REGISTERS = WG == 3     ? 152
                                   : CTAS == 1 ? 216
                                               : 96;

// The epilogue's staging of BF16 outputs (one CTA an SM only): per consumer warpgroup 64 token rows of
// one m-tile's ≤ 64 features (128 bytes) + 16, so a stmatrix's eight rows start in distinct banks.
constexpr int STAGED_PITCH = 128 + 16;

// Shared memory per stage: the activation tile (wgmma B, N rows × 128 B in the 128-byte swizzle,
// 1024-byte aligned), the codes chunk-major ([2 chunks][BM rows][16 B]: a quarter-warp's reads of
// eight rows fall in distinct banks) and the scales ([BM rows][4 B]). In line order (LINE,
// nvfp4_layout.h) a row's 16-byte lane slot holds codes of both halves of its 128-block, so the codes
// come a block at a time into a ring of their own: CODE_PAIRS regions of two stages' codes
// ([4 lane slots][BM rows][16 B]), one more than half the stages, so a pair's region is refilled only
// after both its stages were consumed (the producer waits for fill f − STAGES before fill f).
template <int N, bool LINE = false, int WG = 2, int CTAS = CTAS_PER_SM<N>>
struct Layout {
  static constexpr int ROWS = BM<WG>;
  static constexpr int ACT_STAGE = N * 128;
  static constexpr int CODE_STAGE = ROWS * BK / 2;
  static constexpr int SCALE_STAGE = ROWS * BK / 16;
  static constexpr int STAGE = ACT_STAGE + CODE_STAGE + SCALE_STAGE;
  // Bytes in flight for the memory-bound small N; two CTAs an SM share its 227 KB.
  static constexpr int STAGES = std::min(8, (CTAS == 1 ? 192 * 1024 : 100 * 1024) / STAGE);
  static constexpr int CODE_PAIRS = STAGES / 2 + 1;
  static constexpr int CODE_STAGES = LINE ? 2 * CODE_PAIRS : STAGES;
  static constexpr int ACT_OFFSET = 0;
  static constexpr int CODE_OFFSET = STAGES * ACT_STAGE;
  static constexpr int SCALE_OFFSET = CODE_OFFSET + CODE_STAGES * CODE_STAGE;
  static constexpr int BARRIER_OFFSET = SCALE_OFFSET + STAGES * SCALE_STAGE;
  static constexpr int ROW_SCALES_OFFSET = BARRIER_OFFSET + 2 * STAGES * 8;
  static constexpr int STAGING_OFFSET = ROW_SCALES_OFFSET + N * int(sizeof(float));
  static constexpr int STAGING = CTAS == 1 ? WG * 64 * STAGED_PITCH : 0;
  static constexpr int BYTES = STAGING_OFFSET + STAGING + 1024;  // + alignment slack
  static_assert(BYTES * CTAS <= 227 * 1024, "Hopper's shared memory per SM");
};

struct Params {
  // Line-order expert codes as 2-D tensors of rows × in_features / 2 bytes for the copy engine (TMA):
  // boxes of 16 bytes (one lane slot) × a slice's rows of a projection.
  CUtensorMap code_maps[2];
  CUtensorMap act_map;      // the activations as a 2-D tensor, when their rows are in order (TMA bit 2)
  int64_t act_rows;         // its rows: the pairs (MoE) or m (dense)
  const uint8_t* codes[2];  // gate, up (gated) or down / dense in [0]
  const uint8_t* scales[2];
  const float* global_scales[2];  // per expert; null: `scale` (the dense weight's weight_scale_2)
  float scale;
  int n, k;  // weight rows per expert (per projection), in_features
  const uint16_t* act;
  const int32_t* sorted_pairs;
  int top_k;
  const float* row_scales;
  const int32_t* tile_offsets;  // the MoE tile list; null for a dense GEMM of m rows
  const int4* tiles;
  int experts, m;
  int slices;  // CTAs' weight-row slices per row tile (BM rows, gated BM / 2 features)
  void* out;
  bool out_fp32;
  bool line_order;          // expert weights in line order (nvfp4_layout.h); dense weights never (the kernels' LINE)
  bool act_fragment_order;  // act's columns in fragment order (nvfp4_layout.h; the kernels' FRAG)
  bool out_fragment_order;  // write the BF16 outputs' columns in fragment order (for the next wgmma GEMM)
};

// One work item's row tile: the expert, its first sorted row (or dense token row) and its rows.
struct RowTile {
  int expert, row0, rows;
};
__device__ __forceinline__ int row_tiles(const Params& p, int n) {
  return p.tiles ? p.tile_offsets[p.experts] : (p.m + n - 1) / n;
}
__device__ __forceinline__ RowTile row_tile(const Params& p, int tile, int n) {
  if (!p.tiles) return {0, tile * n, min(n, p.m - tile * n)};
  const int4 t = p.tiles[tile];
  return {t.x, t.y, t.z};
}
__device__ __forceinline__ int source_row(const Params& p, int sorted_row) {
  return p.sorted_pairs ? p.sorted_pairs[sorted_row] / p.top_k : sorted_row;
}

// A local weight row's projection (0: gate, or the only one; 1: up) and its weight row in it. A
// consumer thread owns local rows 64g + 16w + i and that + 8 (warpgroup g, warp w, i = lane / 4: its
// two A-fragment rows). Gated, those two are the gate and the up row
// of one feature, so SwiGLU needs nothing from another thread; each 64 local rows are 32 features.
template <bool GATED>
__device__ __forceinline__ int projection(int local) {
  return GATED ? (local / 8) % 2 : 0;
}
template <bool GATED, int ROWS>
__device__ __forceinline__ int weight_row(int slice, int local) {
  if constexpr (GATED)
    return slice * (ROWS / 2) + 32 * (local / 64) + 8 * ((local % 64) / 16) + local % 8;
  else
    return slice * ROWS + local;
}

}  // namespace
}  // namespace nibble::cuda
