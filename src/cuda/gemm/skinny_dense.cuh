// The dense skinny kernels' launch description, shared by skinny_gemm.cu and skinny_qkv_rope.cu:
// up to three weights sharing one input as segments of one grid of m16 tiles, and where a CTA's
// weight rows and k-blocks lie.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "cuda/gemm/linear_nvfp4.cuh"
#include "cuda/gemm/skinny_fragments.cuh"

namespace nibble::cuda::skinny_dense {

using skinny::WeightFragments;

constexpr int MAX_SEGMENTS = 3;

struct DenseSegment {
  const uint8_t* codes;
  const uint8_t* scales;
  float alpha;
  float* y;
  int rows;
  int tile_begin;  // first m-tile (blockIdx.x) of this weight
};

struct DenseParams {
  DenseSegment seg[MAX_SEGMENTS];
  int count;
  int k;  // this launch's k range: [k_offset, k_offset + k) of rows k_stride long
  int k_stride;
  int k_offset;
  bool accumulate;  // y += (a later k range of an in_features beyond SKINNY_MAX_K)
  const uint16_t* x;
  int m;
  const float* row_scales;
};

// The CTA's m-tile: which weight of the launch (segment s), its first row m0, and the warp's k-blocks
// [kb0, kb0 + nkb) of the launch's k range, whose weight fragments are loaded into w (they do not
// depend on earlier kernels: both dense kernels call this before their PDL wait).
struct DenseTile {
  int s, m0, kb0, nkb;
};
// The segment of the launch's m16 tile `tile` (DenseParams' tiles of all weights in turn).
__device__ __forceinline__ int segment_of(const DenseParams& p, int tile) {
  int s = 0;
#pragma unroll
  for (int i = 1; i < MAX_SEGMENTS; ++i)
    if (i < p.count && tile >= p.seg[i].tile_begin) s = i;
  return s;
}

// The lane's weight rows g and g + 8 of m16 tile `tile` from the launch's k_offset (codes null past
// the weight, or everywhere where the tile does not exist), its segment and first row.
struct TileRows {
  int s, m0;
  const uint8_t* codes[2];
  const uint8_t* scales[2];
};
__device__ __forceinline__ TileRows tile_rows(const DenseParams& p, int tile, bool exists) {
  TileRows t;
  t.s = segment_of(p, tile);
  const DenseSegment& seg = p.seg[t.s];
  const int g = (threadIdx.x & 31) >> 2;
  t.m0 = (tile - seg.tile_begin) * 16;
  const size_t code_row = size_t(p.k_stride) / 2, scale_row = size_t(p.k_stride) / 16;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = t.m0 + g + 8 * h;
    t.codes[h] = exists && row < seg.rows ? seg.codes + row * code_row + p.k_offset / 2 : nullptr;
    t.scales[h] = seg.scales + min(row, seg.rows - 1) * scale_row + p.k_offset / 16;
  }
  return t;
}

template <int BLOCKS>
__device__ __forceinline__ DenseTile load_dense_tile(const DenseParams& p, WeightFragments<BLOCKS>& w) {
  const int warp = threadIdx.x >> 5, c = threadIdx.x & 3;
  const TileRows rows = tile_rows(p, int(blockIdx.x), true);
  const int kb0 = warp * BLOCKS, nkb = min(BLOCKS, p.k / 128 - kb0);
  w.load(rows.codes, rows.scales, kb0, nkb, c);
  return {rows.s, rows.m0, kb0, nkb};
}

// p's segments, one a weight of the launch (checked: 1 to MAX_SEGMENTS of them sharing in_features,
// aligned, x too; outputs null where the kernel writes no y), the m-tiles of all of them into `tiles`;
// static W4A4's input_scale (> 0) folded into each alpha.
Status fill_segments(const uint16_t* x, const DeviceNvfp4Weight* const* weights, float* const* outputs, int count,
                     float input_scale, const char* what, DenseParams& p, int& tiles);

}  // namespace nibble::cuda::skinny_dense
