// The warp-level pieces of decode attention on BF16 mma.sync (decode_attention.cu): a 16-key block's
// K/V fragments loaded straight from the paged cache, and its scores, online softmax and P·V.
#pragma once

#include <cuda_bf16.h>

#include <cfloat>
#include <cstdint>

#include "cuda/nvfp4/nvfp4_fragments.cuh"

namespace nibble::cuda::decode_attention_device {

constexpr int D = 128;          // head_dim
constexpr int BLOCK_KEYS = 16;  // keys per warp step: one mma k of P·V
constexpr int MAX_GROUP = 8;    // query heads per KV head: one mma n-tile of Pᵀ

// Fragment layouts (g = lane / 4, c = lane % 4; nvfp4_fragments.cuh's mma_bf16):
// - S = Q·Kᵀ over k = d: the reduction may visit d in any order as long as Q and K agree, so thread
//   (g, c) holds d 32c … 32c + 31 of query head g (A rows g; rows g + 8 are zero) and of key g of each
//   8-key half (B column g): word 2s and 2s + 1 of those 64 bytes are k-step s's k 2c… and 2c + 8….
// - Oᵀ = Vᵀ·Pᵀ (m = d, n = query heads, k = keys): Pᵀ's B fragment (k 2c, 2c + 1; column g) is
//   exactly S's accumulator (row g; columns 2c, 2c + 1) of each 8-key half, so P never moves between
//   lanes. m-tile mt's rows g and g + 8 are d 16g + 2mt and 16g + 2mt + 1, so the thread's Vᵀ
//   fragments come from d 16g … 16g + 15 of keys 2c, 2c + 1, 2c + 8, 2c + 9: 32 bytes a key. Its
//   accumulators are heads 2c, 2c + 1 at those d.
struct BlockFragments {
  uint4 k[2][4];  // [8-key half][16-byte piece]: key 8·half + g, d 32c …
  uint4 v[4][2];  // [key 2c, 2c + 1, 2c + 8, 2c + 9][piece]: d 16g …
};

// The 16 keys from `first` (a multiple of 16 inside one page); keys from `ctx` on read as zeros
// (a page's unwritten slots may hold NaN bit patterns, and 0 · NaN is NaN).
__device__ __forceinline__ void load_block(BlockFragments& f, const uint16_t* k_cache, const uint16_t* v_cache,
                                           const int32_t* table, int page_size, int64_t key_stride, int head_offset,
                                           int first, int ctx, int g, int c) {
  const int64_t base = (int64_t(table[first / page_size]) * page_size + first % page_size) * key_stride + head_offset;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int key = 8 * half + g;
    const uint4* src = reinterpret_cast<const uint4*>(k_cache + base + key * key_stride + 32 * c);
#pragma unroll
    for (int i = 0; i < 4; ++i) f.k[half][i] = first + key < ctx ? __ldcg(src + i) : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int key = 2 * c + (j & 1) + 8 * (j >> 1);
    const uint4* src = reinterpret_cast<const uint4*>(v_cache + base + key * key_stride + 16 * g);
#pragma unroll
    for (int i = 0; i < 2; ++i) f.v[j][i] = first + key < ctx ? __ldcg(src + i) : make_uint4(0, 0, 0, 0);
  }
}

struct WarpSoftmax {
  float m = -FLT_MAX;  // running max of head g's scaled scores (log2 units); -FLT_MAX: no key yet
  float l = 0.0f;      // this thread's share of head g's running sum
  float o[8][4] = {};  // Oᵀ accumulators: m-tile, then (head 2c, 2c + 1) × (d 16g + 2mt, + 1)
};

// One 16-key block: scores, online softmax, P·V.
__device__ __forceinline__ void attend_block(WarpSoftmax& w, const BlockFragments& f, const uint32_t (&qw)[16],
                                             int first, int ctx, float scale_log2, int c) {
  float s[2][4] = {};
#pragma unroll
  for (int step = 0; step < 8; ++step) {
    const uint32_t a[4] = {qw[2 * step], 0u, qw[2 * step + 1], 0u};
#pragma unroll
    for (int half = 0; half < 2; ++half)
      mma_bf16(s[half], a, word_of(f.k[half][step / 2], (2 * step) % 4),
               word_of(f.k[half][step / 2], (2 * step) % 4 + 1));
  }
  // Row g's scores of keys 8·half + 2c, + 1 (accumulator elements 0, 1; 2, 3 are the zero rows).
  float x[2][2];
  float block_max = -FLT_MAX;
#pragma unroll
  for (int half = 0; half < 2; ++half)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const bool valid = first + 8 * half + 2 * c + e < ctx;
      x[half][e] = valid ? s[half][e] * scale_log2 : -FLT_MAX;
      block_max = fmaxf(block_max, x[half][e]);
    }
  block_max = fmaxf(block_max, __shfl_xor_sync(0xFFFFFFFFu, block_max, 1));
  block_max = fmaxf(block_max, __shfl_xor_sync(0xFFFFFFFFu, block_max, 2));
  const float m_new = fmaxf(w.m, block_max);  // finite: every block has a key below ctx
  const float correction = exp2f(w.m - m_new);
  w.m = m_new;
  float p[2][2], sum = 0.0f;
#pragma unroll
  for (int half = 0; half < 2; ++half)
#pragma unroll
    for (int e = 0; e < 2; ++e)
      p[half][e] = x[half][e] == -FLT_MAX ? 0.0f : exp2f(x[half][e] - m_new), sum += p[half][e];
  w.l = w.l * correction + sum;
  // The accumulators hold heads 2c and 2c + 1, whose corrections lanes 8c and 8c + 4 computed.
  const float corr_even = __shfl_sync(0xFFFFFFFFu, correction, 8 * c);
  const float corr_odd = __shfl_sync(0xFFFFFFFFu, correction, 8 * c + 4);
  const __nv_bfloat162 p0 = __floats2bfloat162_rn(p[0][0], p[0][1]), p1 = __floats2bfloat162_rn(p[1][0], p[1][1]);
  const uint32_t b0 = *reinterpret_cast<const uint32_t*>(&p0), b1 = *reinterpret_cast<const uint32_t*>(&p1);
#pragma unroll
  for (int mt = 0; mt < 8; ++mt) {
    w.o[mt][0] *= corr_even, w.o[mt][1] *= corr_odd, w.o[mt][2] *= corr_even, w.o[mt][3] *= corr_odd;
    const uint32_t v0 = word_of(f.v[0][mt / 4], mt % 4), v1 = word_of(f.v[1][mt / 4], mt % 4);
    const uint32_t v2 = word_of(f.v[2][mt / 4], mt % 4), v3 = word_of(f.v[3][mt / 4], mt % 4);
    const uint32_t a[4] = {__byte_perm(v0, v1, 0x5410u), __byte_perm(v0, v1, 0x7632u), __byte_perm(v2, v3, 0x5410u),
                           __byte_perm(v2, v3, 0x7632u)};
    mma_bf16(w.o[mt], a, b0, b1);
  }
}

// The warp's softmax state into shared memory: head g's m and l (lanes c = 0), and o[head][d].
__device__ __forceinline__ void store_softmax(const WarpSoftmax& w, float* m, float* l, float (*o)[D]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  if (c == 0) m[g] = w.m, l[g] = w.l;
#pragma unroll
  for (int mt = 0; mt < 8; ++mt) {
    o[2 * c][16 * g + 2 * mt] = w.o[mt][0];
    o[2 * c + 1][16 * g + 2 * mt] = w.o[mt][1];
    o[2 * c][16 * g + 2 * mt + 1] = w.o[mt][2];
    o[2 * c + 1][16 * g + 2 * mt + 1] = w.o[mt][3];
  }
}

// Head h's softmax merged over WARPS warps' states in shared memory (store_softmax's arrays), at
// column d: the running max m, sum l and output o (a warp without keys: m = -FLT_MAX, weight 0).
template <int WARPS>
__device__ __forceinline__ void merge_warps(const float (&m)[WARPS][MAX_GROUP], const float (&l)[WARPS][MAX_GROUP],
                                            const float (&o)[WARPS][MAX_GROUP][D], int h, int d, float& m_out,
                                            float& l_out, float& o_out) {
  float mm = -FLT_MAX;
#pragma unroll
  for (int i = 0; i < WARPS; ++i) mm = fmaxf(mm, m[i][h]);
  float ll = 0.0f, oo = 0.0f;
#pragma unroll
  for (int i = 0; i < WARPS; ++i) {
    const float weight = m[i][h] == -FLT_MAX ? 0.0f : exp2f(m[i][h] - mm);
    ll += l[i][h] * weight, oo += o[i][h][d] * weight;
  }
  m_out = mm, l_out = ll, o_out = oo;
}

}  // namespace nibble::cuda::decode_attention_device
