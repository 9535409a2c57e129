// Device helpers of the skinny NVFP4 kernels (dense in skinny_gemm.cu, MoE in skinny_moe.cu): a
// warp's weight fragments loaded straight from global memory, its mma steps over k-blocks, the
// CTA's k-split sum, and the launch rules they share. The k permutation is skinny_gemm.cu's; LINE:
// the weights are in line order (nvfp4_layout.h, expert weights), and lane c's code word q is
// physical k 32q + 8c … + 7, so its x loads of a k-block are chunks 4q + c (x_chunk).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <string>

#include "core/status.h"
#include "cuda/common/check.cuh"
#include "cuda/nvfp4/nvfp4_fragments.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/gemm/skinny_gemm.cuh"

namespace nibble::cuda::skinny {

inline constexpr int MAX_WARPS = 16;

// Weights are read once: keep them out of L1. L2_FETCH 128: the L2 brings in the aligned 128 bytes
// around the address (the row's next k-block with it) rather than only the sectors asked for.
template <int L2_FETCH = 0>
__device__ __forceinline__ uint4 load_stream(const uint8_t* p) {
  static_assert(L2_FETCH == 0 || L2_FETCH == 128);
  uint4 v;
  if constexpr (L2_FETCH == 128)
    asm volatile("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
  else
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
  return v;
}

// Line order: lane c's code words q are k16 blocks 2q + c / 2 of the block's eight scale codes —
// this byte_perm selector of the eight as two words picks them (bytes q of the result).
__device__ __forceinline__ uint32_t line_scale_selector(int c) { return c >> 1 ? 0x7531u : 0x6420u; }

// A lane's four scale codes of a k-block in line order from the block's eight, L1-cached (the next
// blocks' share its sector); L2_FETCH 128 as above (a 2,048-wide row's whole scale row).
template <int L2_FETCH = 0>
__device__ __forceinline__ uint32_t load_line_scales(const uint2* p, uint32_t selector) {
  static_assert(L2_FETCH == 0 || L2_FETCH == 128);
  uint2 v;
  if constexpr (L2_FETCH == 0)
    v = __ldg(p);
  else
    asm("ld.global.nc.L2::128B.v2.u32 {%0,%1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return __byte_perm(v.x, v.y, selector);
}

// The 16-byte chunk (8 values) of a 128-wide k-block of x that lane c's code word q multiplies.
template <bool LINE>
__device__ __forceinline__ int x_chunk(int c, int q) {
  return LINE ? 4 * q + c : 4 * c + q;
}

// One token's x fragment of k-block kb of `row` (in any memory): the n-tile's column 0, read where
// `take` (lanes g == 0 of a real block), zeros elsewhere. (The row is indexed only where taken.)
template <bool LINE>
__device__ __forceinline__ void token_x_fragment(const uint16_t* row, int kb, bool take, int c, uint4 (&xv)[4]) {
#pragma unroll
  for (int q = 0; q < 4; ++q)
    xv[q] = take ? reinterpret_cast<const uint4*>(row + kb * 128)[x_chunk<LINE>(c, q)] : make_uint4(0, 0, 0, 0);
}

// Lane c's scale codes of a k-block from the row's scale codes at the block: LINE, the four of its
// code words (bytes q); otherwise those of k16 blocks 2c (low byte) and 2c + 1.
template <bool LINE>
__device__ __forceinline__ uint32_t load_scales(const uint8_t* block_scales, int c) {
  if constexpr (LINE)
    return load_line_scales(reinterpret_cast<const uint2*>(block_scales), line_scale_selector(c));
  else
    return __ldg(reinterpret_cast<const uint16_t*>(block_scales + 2 * c));
}

// One warp's weight fragments: rows g and g + 8 (h = 0, 1) over BLOCKS k-blocks.
template <int BLOCKS, bool LINE = false>
struct WeightFragments {
  uint4 codes[2][BLOCKS];
  uint32_t scales[2][BLOCKS];  // load_scales<LINE>

  // codes[h] / scales[h]: row g + 8h of the weight (null past the weight: zeros), from k-block kb0.
  __device__ void load(const uint8_t* const (&row_codes)[2], const uint8_t* const (&row_scales)[2], int kb0, int nkb,
                       int c) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int b = 0; b < BLOCKS; ++b) {
        if (b < nkb && row_codes[h]) {
          codes[h][b] = load_stream(row_codes[h] + (kb0 + b) * 64 + 16 * c);
          scales[h][b] = load_scales<LINE>(row_scales[h] + (kb0 + b) * 8, c);
        } else {
          codes[h][b] = make_uint4(0, 0, 0, 0);
          scales[h][b] = 0;
        }
      }
  }
  // The same where every block and both rows exist (no guards: one base address a row, the blocks
  // at immediate offsets).
  __device__ void load_all(const uint8_t* const (&row_codes)[2], const uint8_t* const (&row_scales)[2], int kb0,
                           int c) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint8_t* code = row_codes[h] + kb0 * 64 + 16 * c;
      const uint8_t* scale = row_scales[h] + kb0 * 8;
#pragma unroll
      for (int b = 0; b < BLOCKS; ++b)
        codes[h][b] = load_stream(code + b * 64), scales[h][b] = load_scales<LINE>(scale + b * 8, c);
    }
  }
};

// Code word q of the lane's rows g, g + 8 (h = 0, 1) as the A fragments of mma steps 2q (a0) and
// 2q + 1 (a1); scale: the BF16 operands of its block scales (block_scale_bf16x2 of load_scales<LINE>).
template <bool LINE = false>
__device__ __forceinline__ void decode_word_fragments(const uint4 (&codes)[2], const uint32_t (&scale)[2][LINE ? 4 : 2],
                                                      int q, uint32_t (&a0)[4], uint32_t (&a1)[4]) {
  uint32_t lo[4], hi[4];
  decode_code_word(word_of(codes[0], q), lo);
  decode_code_word(word_of(codes[1], q), hi);
  const int s = LINE ? q : q >> 1;  // LINE: one scale a code word, else one a pair of words
#pragma unroll
  for (int i = 0; i < 4; ++i) lo[i] = bf16x2_mul(lo[i], scale[0][s]), hi[i] = bf16x2_mul(hi[i], scale[1][s]);
  a0[0] = lo[0], a0[1] = hi[0], a0[2] = lo[1], a0[3] = hi[1];
  a1[0] = lo[2], a1[1] = hi[2], a1[2] = lo[3], a1[3] = hi[3];
}

// The BF16 operands of a k-block's block scales for the lane's two rows (decode_word_fragments).
template <bool LINE = false>
__device__ __forceinline__ void kblock_scales(const uint32_t (&scales)[2], uint32_t (&scale)[2][LINE ? 4 : 2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < (LINE ? 4 : 2); ++i) scale[h][i] = block_scale_bf16x2(scales[h], i);
}

// One k-block's A fragments of the lane's rows g, g + 8 (h = 0, 1), from its code words and scale
// codes (load_scales<LINE>): a[q] feeds mma steps 2q (a[q][0..3]) and 2q + 1 (a[q][4..7]); code word q
// is physical k chunk x_chunk<LINE>(c, q).
template <bool LINE = false>
__device__ __forceinline__ void decode_kblock(const uint4 (&codes)[2], const uint32_t (&scales)[2],
                                              uint32_t (&a)[4][8]) {
  uint32_t scale[2][LINE ? 4 : 2];
  kblock_scales<LINE>(scales, scale);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    uint32_t a0[4], a1[4];
    decode_word_fragments<LINE>(codes, scale, q, a0, a1);
#pragma unroll
    for (int i = 0; i < 4; ++i) a[q][i] = a0[i], a[q][4 + i] = a1[i];
  }
}

// acc[n] += the decoded k-block a · x(column g of n-tile n), xv[n] the lane's x fragments of the block.
template <int NT>
__device__ __forceinline__ void mma_decoded(const uint32_t (&a)[4][8], const uint4 (&xv)[NT][4], float (&acc)[NT][4]) {
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint32_t a0[4] = {a[q][0], a[q][1], a[q][2], a[q][3]};
    const uint32_t a1[4] = {a[q][4], a[q][5], a[q][6], a[q][7]};
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      mma_bf16(acc[n], a0, xv[n][q].x, xv[n][q].y);
      mma_bf16(acc[n], a1, xv[n][q].z, xv[n][q].w);
    }
  }
}

// One k-block of one m-tile: acc[n] += Ŵ(rows g, g + 8) · x(column g of n-tile n).
template <int NT, bool LINE = false>
__device__ __forceinline__ void mma_kblock(const uint4 (&codes)[2], const uint32_t (&scales)[2],
                                           const uint4 (&xv)[NT][4], float (&acc)[NT][4]) {
  uint32_t a[4][8];
  decode_kblock<LINE>(codes, scales, a);
  mma_decoded<NT>(a, xv, acc);
}

// acc[n] += Ŵ(rows g, g + 8) · x(column g of n-tile n) over the warp's k-blocks; x_rows[n] is the
// lane's token row (null: a zero column; GUARDED false: never null, and all BLOCKS k-blocks exist).
// With one n-tile every x load is issued before the first mma (one L2 round trip, not one per
// k-block); otherwise they load per block (registers: preloading two n-tiles' x for two blocks took
// 114-118 registers and made dense M = 32-64 1.3x slower, H200).
template <int BLOCKS, int NT, bool GUARDED = true, bool LINE = false>
__device__ __forceinline__ void mma_blocks(const WeightFragments<BLOCKS, LINE>& w, const uint16_t* const (&x_rows)[NT],
                                           int kb0, int nkb, int c, float (&acc)[NT][4]) {
  constexpr int PRELOADED = NT == 1 ? BLOCKS : 1;
  if constexpr (!GUARDED) nkb = BLOCKS;
  uint4 x_all[PRELOADED][NT][4];
  auto load_x = [&](int b, uint4(&xv)[NT][4]) {
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int q = 0; q < 4; ++q)
        xv[n][q] = !GUARDED || (b < nkb && x_rows[n])
                       ? __ldg(reinterpret_cast<const uint4*>(x_rows[n] + (kb0 + b) * 128) + x_chunk<LINE>(c, q))
                       : make_uint4(0, 0, 0, 0);
  };
  if constexpr (PRELOADED > 1)
#pragma unroll
    for (int b = 0; b < BLOCKS; ++b) load_x(b, x_all[b]);
#pragma unroll
  for (int b = 0; b < BLOCKS; ++b) {
    if (b >= nkb) break;
    if constexpr (PRELOADED == 1) load_x(b, x_all[0]);
    mma_kblock<NT, LINE>({w.codes[0][b], w.codes[1][b]}, {w.scales[0][b], w.scales[1][b]}, x_all[PRELOADED > 1 ? b : 0],
                         acc);
  }
}

// The CTA's warps split k; warp 0 ends with the sum over warps in warp order (returns false for
// the other warps, which are done).
template <int COUNT>
__device__ __forceinline__ bool reduce_warps(float (&acc)[COUNT][4], float* partial) {
  const int warps = blockDim.x / 32, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (warps == 1) return true;
  if (warp > 0)
#pragma unroll
    for (int i = 0; i < COUNT * 4; ++i) partial[((warp - 1) * COUNT * 4 + i) * 32 + lane] = acc[i / 4][i % 4];
  __syncthreads();
  if (warp > 0) return false;
  for (int w = 0; w < warps - 1; ++w)
#pragma unroll
    for (int i = 0; i < COUNT * 4; ++i) acc[i / 4][i % 4] += partial[(w * COUNT * 4 + i) * 32 + lane];
  return true;
}

// k-blocks per warp: 4 (more loads in flight per lane) for long k ranges, but 2 — twice the warps —
// for the MoE's 8-row tiles and dense launches of two n-tiles. H200, codes in the GPU layout
// (docs/lab/perf-notebook.md "Repacked NVFP4 codes"), 4/2 blocks: MoE block T = 1 26.4/25.2 µs, T = 16 121/127;
// dense M = 16 k_proj 4.75/4.17, M = 32 q_proj 10.3/9.1, M = 1 q_proj 4.13/4.43.
// Never more than MAX_WARPS warps: 4 blocks a warp beyond 2 · MAX_WARPS blocks.
inline int blocks_per_warp(int k, bool dense, int nt) {
  const int blocks = k / 128;
  if (blocks > 2 * MAX_WARPS) return 4;
  return blocks < 8 || (dense ? nt > 1 : nt == 1) ? 2 : 4;
}

// `kernel` is instantiated for per_warp k-blocks per warp and nt n-tiles.
template <class Kernel, class Params>
Status launch(Kernel kernel, dim3 grid, int k, int per_warp, int nt, const Params& p, cudaStream_t stream,
              const char* what) {
  const int warps = (k / 128 + per_warp - 1) / per_warp;
  const size_t smem = size_t(warps - 1) * nt * 4 * 32 * sizeof(float);
  return cuda_status(launch_pdl(kernel, grid, dim3(unsigned(warps * 32)), smem, stream, p), what);
}

inline Status check_in_features(int64_t k, bool dense, const char* what) {
  if (dense ? skinny_linear_supported(k) : skinny_supported(k)) return Status::ok();
  return Status::error(std::string(what) + ": in_features " + std::to_string(k) + " is not a multiple of 128" +
                       (dense ? "" : " up to " + std::to_string(SKINNY_MAX_K)) + " (use another backend)");
}

}  // namespace nibble::cuda::skinny
