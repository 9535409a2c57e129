// Device routines shared by the routing kernels: the per-token softmax + top-k of one warp and the
// block-wide token → expert grouping (counts, offsets, sorted rows, tile list). Used by the
// separate router/grouping kernels and by the one-launch small-batch router.
#pragma once

#include <cfloat>
#include <cstdint>

#include "cuda/moe/moe_grouping.cuh"

namespace nibble::cuda {

inline constexpr int ROUTER_MAX_PER_LANE = 8;  // experts ≤ 256 in the warp top-k

// acc + Σ a[i] · b[i] over 8 BF16 pairs (one 16-byte word of each), in index order: a lane's part of a
// router logit (the one-launch routers compute every logit the same way, so they route alike).
__device__ __forceinline__ float dot8(const uint4& a, const uint4& b, float acc) {
  const uint32_t wa[4] = {a.x, a.y, a.z, a.w}, wb[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    acc = fmaf(__uint_as_float(wa[i] << 16), __uint_as_float(wb[i] << 16), acc);
    acc = fmaf(__uint_as_float(wa[i] & 0xFFFF0000u), __uint_as_float(wb[i] & 0xFFFF0000u), acc);
  }
  return acc;
}

// The same with fp32 weights (ERNIE-4.5's router): 8 BF16 inputs · 8 fp32 weights.
__device__ __forceinline__ float dot8(const float4& w0, const float4& w1, const uint4& x, float acc) {
  const float w[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
  const uint32_t xw[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    acc = fmaf(w[2 * i], __uint_as_float(xw[i] << 16), acc);
    acc = fmaf(w[2 * i + 1], __uint_as_float(xw[i] & 0xFFFF0000u), acc);
  }
  return acc;
}

// A float's bits as an unsigned key in the float order (−0 taken as +0), and back: warp maxima by
// one redux.sync instead of five shuffle rounds.
__device__ __forceinline__ unsigned sortable_key(float x) {
  const unsigned u = __float_as_uint(x + 0.0f);
  return u & 0x80000000u ? ~u : u | 0x80000000u;
}
__device__ __forceinline__ float from_sortable_key(unsigned k) {
  return __uint_as_float(k & 0x80000000u ? k & 0x7FFFFFFFu : ~k);
}

// One warp: softmax over row[0, experts) (fp32), top-k by k rounds of a warp arg-max on
// (score, −expert) so ties pick the lower expert (torch.topk), where the score is the probability
// plus bias[e] when a bias is given (ERNIE: it chooses, the probabilities weigh), renormalized over
// the k by max(sum, norm_min) when asked. Lane j < top_k writes slot j. A global `row` may be written
// by other CTAs of the same grid: it is read through L2 (ld.global.cg); SHARED: `row` is in shared memory.
// A round: each lane's best key, the warp's maximum key and the lowest expert holding it by two
// redux.sync (the five dependent shuffle steps of a (score, expert) arg-max took ~3 µs for top-8 of
// 128 in the one-launch MoE block, H200), the winner's probability by one shuffle.
// This is warp_softmax_topk_values, from logits already in the lanes' registers (p[i]: expert
// lane + 32 i, −FLT_MAX past the row; the one-launch MoE block polls them); warp_softmax_topk below
// loads them from `row` first.
__device__ __forceinline__ void warp_softmax_topk_values(float (&p)[ROUTER_MAX_PER_LANE], int experts, int top_k,
                                                         bool renormalize, const float* bias, float norm_min,
                                                         int32_t* expert_ids, float* weights) {
  const int lane = threadIdx.x & 31;
  float m = -FLT_MAX;
#pragma unroll
  for (int i = 0; i < ROUTER_MAX_PER_LANE; ++i) m = fmaxf(m, p[i]);
  m = from_sortable_key(__reduce_max_sync(0xFFFFFFFFu, sortable_key(m)));
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < ROUTER_MAX_PER_LANE; ++i) {
    const int e = lane + 32 * i;
    p[i] = e < experts ? expf(p[i] - m) : 0.0f;
    sum += p[i];
  }
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, offset);
  unsigned score[ROUTER_MAX_PER_LANE];  // keys; 0 for an expert taken or past the row
#pragma unroll
  for (int i = 0; i < ROUTER_MAX_PER_LANE; ++i) {
    const int e = lane + 32 * i;
    p[i] = e < experts ? p[i] / sum : 0.0f;
    score[i] = e < experts ? sortable_key(bias ? p[i] + bias[e] : p[i]) : 0u;
  }

  float chosen_sum = 0.0f, chosen_p = 0.0f;
  int chosen_e = 0;
  for (int k = 0; k < top_k; ++k) {
    unsigned best = 0;
    int best_e = INT32_MAX;
    float best_p = 0.0f;
#pragma unroll
    for (int i = 0; i < ROUTER_MAX_PER_LANE; ++i)  // in expert order: the first of equal keys stays
      if (score[i] > best) best = score[i], best_e = lane + 32 * i, best_p = p[i];
    const unsigned top = __reduce_max_sync(0xFFFFFFFFu, best);
    const int e = int(__reduce_min_sync(0xFFFFFFFFu, best == top ? unsigned(best_e) : 0xFFFFFFFFu));
    const float chosen = __shfl_sync(0xFFFFFFFFu, best_p, e & 31);
#pragma unroll
    for (int i = 0; i < ROUTER_MAX_PER_LANE; ++i)
      if (lane + 32 * i == e) score[i] = 0u;  // taken
    chosen_sum += chosen;
    if (lane == k) chosen_p = chosen, chosen_e = e;
  }
  if (lane < top_k) {
    expert_ids[lane] = chosen_e;
    weights[lane] = renormalize ? chosen_p / fmaxf(chosen_sum, norm_min) : chosen_p;
  }
}

template <bool SHARED = false>
__device__ __forceinline__ void warp_softmax_topk(const float* row, int experts, int top_k, bool renormalize,
                                                  const float* bias, float norm_min, int32_t* expert_ids,
                                                  float* weights) {
  const int lane = threadIdx.x & 31;
  float p[ROUTER_MAX_PER_LANE];
#pragma unroll
  for (int i = 0; i < ROUTER_MAX_PER_LANE; ++i) {
    const int e = lane + 32 * i;
    p[i] = e < experts ? (SHARED ? row[e] : __ldcg(row + e)) : -FLT_MAX;
  }
  warp_softmax_topk_values(p, experts, top_k, renormalize, bias, norm_min, expert_ids, weights);
}

// Exclusive scan of one value per thread over a block of THREADS; returns the thread's prefix and
// the block total in *total. warp_sums: shared [THREADS / 32].
template <int THREADS>
__device__ int block_exclusive_scan(int value, int* warp_sums, int* total) {
  constexpr int WARPS = THREADS / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int inclusive = value;
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int up = __shfl_up_sync(0xFFFFFFFFu, inclusive, offset);
    if (lane >= offset) inclusive += up;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    int s = lane < WARPS ? warp_sums[lane] : 0;
    for (int offset = 1; offset < 32; offset <<= 1) {
      const int up = __shfl_up_sync(0xFFFFFFFFu, s, offset);
      if (lane >= offset) s += up;
    }
    if (lane < WARPS) warp_sums[lane] = s;  // inclusive sums of warps
  }
  __syncthreads();
  const int before = (warp > 0 ? warp_sums[warp - 1] : 0) + inclusive - value;
  *total = warp_sums[WARPS - 1];
  __syncthreads();
  return before;
}

// Shared memory of group_rows.
template <int THREADS>
struct GroupingSmem {
  int count[THREADS];
  int cursor[THREADS];
  int warp_sums[THREADS / 32];
};

// The grouping over one block of THREADS (experts ≤ THREADS): a shared histogram, exclusive scans of
// the counts and of their tile counts, the tile list, then each pair claims its row with a shared
// atomic. A thread's first HELD expert ids are loaded at once into registers and serve both passes
// (one dependent global load per pair and pass made a 16,384-pair grouping ~12 µs of latency); HELD ·
// THREADS pairs need no second load. expert_ids may have been written by this block (the caller
// synchronizes first). staged (shared memory of `pairs` ints, or null): each claimed row is written
// there and the block copies the sorted pairs out in order — stored straight to their rows, every
// warp's 32 stores went to 32 scattered words, which one SM issues a word at a time.
// Expert parallelism: only experts [first, first + experts) are this rank's; their rows are grouped
// under local ids e - first, and every other pair gets no row (pair_rows -1, which the combine skips).
template <int THREADS, int HELD>
__device__ void group_rows(const int32_t* expert_ids, int pairs, int first, int experts, int tile_rows,
                           const ExpertGroups& out, GroupingSmem<THREADS>& sm, int32_t* staged = nullptr) {
  const int tid = threadIdx.x;
  const auto local = [&](int e) { return e - first >= 0 && e - first < experts ? e - first : -1; };
  int held[HELD];
#pragma unroll
  for (int k = 0; k < HELD; ++k) held[k] = tid + k * THREADS < pairs ? local(expert_ids[tid + k * THREADS]) : -1;
  sm.count[tid] = 0;
  __syncthreads();
#pragma unroll
  for (int k = 0; k < HELD; ++k)
    if (held[k] >= 0) atomicAdd(&sm.count[held[k]], 1);
  for (int i = tid + HELD * THREADS; i < pairs; i += THREADS)
    if (const int e = local(expert_ids[i]); e >= 0) atomicAdd(&sm.count[e], 1);
  __syncthreads();
  const int mine = tid < experts ? sm.count[tid] : 0;
  const int my_tiles = (mine + tile_rows - 1) / tile_rows;
  int total_rows, total_tiles;
  const int row_offset = block_exclusive_scan<THREADS>(mine, sm.warp_sums, &total_rows);
  const int tile_offset = block_exclusive_scan<THREADS>(my_tiles, sm.warp_sums, &total_tiles);
  if (tid < experts) {
    out.expert_offsets[tid] = row_offset;
    out.tile_offsets[tid] = tile_offset;
    sm.cursor[tid] = row_offset;
    for (int j = 0; j < my_tiles; ++j)
      out.tiles[tile_offset + j] = make_int4(tid, row_offset + j * tile_rows, min(tile_rows, mine - j * tile_rows), 0);
  }
  if (tid == 0) {
    out.expert_offsets[experts] = total_rows;
    out.tile_offsets[experts] = total_tiles;
  }
  __syncthreads();
  int32_t* sorted = staged ? staged : out.sorted_pairs;
  const auto claim = [&](int i, int expert) {
    if (expert < 0) {  // another rank's expert
      out.pair_rows[i] = -1;
      return;
    }
    const int row = atomicAdd(&sm.cursor[expert], 1);
    sorted[row] = i;
    out.pair_rows[i] = row;
  };
#pragma unroll
  for (int k = 0; k < HELD; ++k)
    if (tid + k * THREADS < pairs) claim(tid + k * THREADS, held[k]);
  for (int i = tid + HELD * THREADS; i < pairs; i += THREADS) claim(i, local(expert_ids[i]));
  if (!staged) return;
  __syncthreads();
  for (int r = tid; r < total_rows; r += THREADS) out.sorted_pairs[r] = staged[r];
}

}  // namespace nibble::cuda
