// The wgmma GEMM's epilogue: a consumer thread's accumulators × the weight and W4A4 row scales (and
// SwiGLU for gate_up) into BF16 or fp32 outputs, through shared memory where it can. Part of the kernel
// in nvfp4_wgmma_kernel.cuh (one translation unit, nvfp4_wgmma.cu, includes these).
#pragma once

#include <cuda_bf16.h>

#include <type_traits>

#include "cuda/common/wgmma.cuh"
#include "cuda/gemm/nvfp4_wgmma_layout.cuh"
#include "cuda/nvfp4/nvfp4_fragments.cuh"
#include "cuda/nvfp4/nvfp4_layout.h"

namespace nibble::cuda {
namespace {

// An item's outputs from a consumer thread's accumulators: acc[4j + 2r + c] is weight row local0 (r = 0)
// or local1 (r = 1), token column t = 8j + 2q + c (the wgmma accumulator layout), × the projection's
// scale and the token's W4A4 row scale; gated, r = 0 is the gate and r = 1 the up row of feature f0,
// and the output is silu(gate) · up (as ref::silu_mul). Columns from the tile's rows on are not stored.
template <bool GATED, int N>
struct Outputs {
  const Params& p;
  const RowTile& tile;
  const float* row_scales;  // the staged W4A4 row scales, or null
  float scale0, scale1;
  int f0, f1, q;

  // silu with the fast exponential and division (a few ulp of fp32 off expf and '/', far inside the BF16
  // rounding of the output; the exact forms took ~70 instructions a column pair, as long as the MMAs
  // of a down item). gate < −87: the denominator overflows and the division gives silu's limit, −0.
  __device__ __forceinline__ float value(const float (&acc)[N / 2], int j, int r, int c, float row_scale) const {
    if constexpr (GATED) {
      const float gate = acc[4 * j + c] * (scale0 * row_scale), up = acc[4 * j + 2 + c] * (scale1 * row_scale);
      return __fdividef(gate, 1.0f + __expf(-gate)) * up;
    } else {
      return acc[4 * j + 2 * r + c] * (scale0 * row_scale);
    }
  }

  // Output feature f's column: f, or its place in fragment order (the host checks n % 32 == 0).
  __device__ __forceinline__ int column(int f) const { return p.out_fragment_order ? int(fragment_order_index(f)) : f; }

  template <typename T>
  __device__ __forceinline__ void store_each(const float (&acc)[N / 2], T* out) const {
#pragma unroll
    for (int j = 0; j < N / 8; ++j) {
      if (8 * j >= tile.rows) break;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int t = 8 * j + 2 * q + c;
        const float row_scale = row_scales ? row_scales[t] : 1.0f;
#pragma unroll
        for (int r = 0; r < (GATED ? 1 : 2); ++r) {
          const int f = r ? f1 : f0;
          const float v = value(acc, j, r, c, row_scale);
          if (t < tile.rows && f < p.n) {
            const size_t at = size_t(tile.row0 + t) * p.n + column(f);
            if constexpr (std::is_same_v<T, float>)
              out[at] = v;
            else
              out[at] = __float2bfloat16_rn(v);
          }
        }
      }
    }
  }

  // BF16 outputs through shared memory (one CTA an SM; rows a multiple of 8 features and the output
  // 16-byte aligned): 64 token columns at a time, each warp stmatrix-transposes its 8 × 8 blocks into
  // token rows of the warpgroup's staging, then the warpgroup writes whole 16-byte runs of features.
  // (Storing each thread's values took ~24 instructions a 4-byte word; this takes ~3.)
  // wg_feature0: the warpgroup's first output feature; tw: the thread in the warpgroup.
  template <bool ROW_SCALES>
  __device__ __forceinline__ void store_bf16_staged(const float (&acc)[N / 2], uint32_t staging, int wg_feature0, int g,
                                                    int tw) const {
    constexpr int FEATURES = GATED ? 32 : 64;  // a warpgroup's outputs: gated, half its rows are the up rows
    constexpr int RUNS = FEATURES / 8;         // 16-byte runs a token row
    constexpr int PITCH = STAGED_PITCH;
    __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out);
    const int warp = tw / 32, lane = tw % 32, matrix = lane / 8, row = lane % 8;
    auto scale_of = [&](int t) { return ROW_SCALES ? row_scales[t] : 1.0f; };
#pragma unroll
    for (int round = 0; round < N / 64; ++round) {
      if (64 * round >= tile.rows) break;
        // Fragment block (j, r) — rows 16·warp + 8r … +7, columns 8j … +7 — goes to staged token rows
        // 8j − 64·round + k, feature columns 16·warp + 8r (gated: the outputs of rows 8·warp … +7).
#pragma unroll
      for (int m = 0; m < (GATED ? 2 : 4); ++m) {
        uint32_t r[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int j = 8 * round + (GATED ? 4 * m + i : 2 * m + i / 2), t0 = 8 * j + 2 * q;
          const int which = GATED ? 0 : i % 2;
          r[i] = pack_bf16x2(value(acc, j, which, 0, scale_of(t0)), value(acc, j, which, 1, scale_of(t0 + 1)));
        }
        const int block = GATED ? 4 * m + matrix : 2 * m + matrix / 2;  // this lane's row address: block's row `row`
        const int column = GATED ? 8 * warp : 16 * warp + 8 * (matrix % 2);
        wgmma::stmatrix_x4_trans(staging + (8 * block + row) * PITCH + column * 2, r);
      }
      asm volatile("bar.sync %0, 128;\n" ::"r"(2 + g) : "memory");
#pragma unroll
      for (int k = 0; k < 64 * RUNS / 128; ++k) {
        const int index = tw + 128 * k, token = index / RUNS, run = index % RUNS;
        const int t = 64 * round + token, f = wg_feature0 + 8 * run;
        uint4 v;
        if (p.out_fragment_order) {  // run (a 32-feature group's chunk c) = pair c of the group's 4 chunks
          const uint32_t group = staging + token * PITCH + (run / 4) * 64 + (run % 4) * 4;
          asm volatile(
              "ld.shared.u32 %0, [%4];\n ld.shared.u32 %1, [%4 + 16];\n"
              "ld.shared.u32 %2, [%4 + 32];\n ld.shared.u32 %3, [%4 + 48];\n"
              : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
              : "r"(group));
        } else {
          asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                       : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                       : "r"(staging + token * PITCH + run * 16));
        }
        if (t < tile.rows && f < p.n) *reinterpret_cast<uint4*>(out + size_t(tile.row0 + t) * p.n + f) = v;
      }
      asm volatile("bar.sync %0, 128;\n" ::"r"(2 + g) : "memory");  // read before the next round writes
    }
  }

  // BF16 outputs with an even row length: lane groups i and i ^ 1 (lanes 4 apart) hold features f and
  // f ^ 1 of the same two tokens, so one shuffle gives each a feature pair of one token, stored as one
  // 4-byte word (half the stores of storing each; the epilogue was as long as a down item's MMAs).
  __device__ __forceinline__ void store_bf16_pairs(const float (&acc)[N / 2], int lane) const {
    __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out);
    const bool even = ((lane >> 2) & 1) == 0;  // f0 is even (features follow lane / 4)
#pragma unroll
    for (int j = 0; j < N / 8; ++j) {
      if (8 * j >= tile.rows) break;
      const int t0 = 8 * j + 2 * q;
      const float scale_t0 = row_scales ? row_scales[t0] : 1.0f, scale_t1 = row_scales ? row_scales[t0 + 1] : 1.0f;
      const int t = even ? t0 : t0 + 1;
#pragma unroll
      for (int r = 0; r < (GATED ? 1 : 2); ++r) {
        const float v0 = value(acc, j, r, 0, scale_t0), v1 = value(acc, j, r, 1, scale_t1);
        const float received = __shfl_xor_sync(0xffffffffu, even ? v1 : v0, 4);
        const float low = even ? v0 : received, high = even ? received : v1;
        const int f = (r ? f1 : f0) & ~1;
        if (t < tile.rows && f < p.n)
          *reinterpret_cast<__nv_bfloat162*>(out + size_t(tile.row0 + t) * p.n + column(f)) =
              __floats2bfloat162_rn(low, high);
      }
    }
  }
};

}  // namespace
}  // namespace nibble::cuda
