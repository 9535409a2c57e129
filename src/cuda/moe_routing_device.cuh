// Device routines shared by the routing kernels: the per-token softmax + top-k of one warp and the
// block-wide token → expert grouping (counts, offsets, sorted rows, tile list). Used by the
// separate router/grouping kernels and by the one-launch small-batch router.
#pragma once

#include <cfloat>
#include <cstdint>

#include "cuda/moe_grouping.cuh"

namespace nibble::cuda {

inline constexpr int ROUTER_MAX_PER_LANE = 8;  // experts ≤ 256 in the warp top-k

// One warp: softmax over row[0, experts) (fp32), top-k by k rounds of a warp arg-max on
// (score, −expert) so ties pick the lower expert (torch.topk), where the score is the probability
// plus bias[e] when a bias is given (ERNIE: it chooses, the probabilities weigh), renormalized over
// the k by max(sum, norm_min) when asked. Lane j < top_k writes slot j. A global `row` may be written
// by other CTAs of the same grid: it is read through L2 (ld.global.cg); SHARED: `row` is in shared memory.
template <bool SHARED = false>
__device__ __forceinline__ void warp_softmax_topk(const float* row, int experts, int top_k, bool renormalize,
                                                  const float* bias, float norm_min, int32_t* expert_ids,
                                                  float* weights) {
  const int lane = threadIdx.x & 31;
  float p[ROUTER_MAX_PER_LANE];
  float m = -FLT_MAX;
#pragma unroll
  for (int i = 0; i < ROUTER_MAX_PER_LANE; ++i) {
    const int e = lane + 32 * i;
    p[i] = e < experts ? (SHARED ? row[e] : __ldcg(row + e)) : -FLT_MAX;
    m = fmaxf(m, p[i]);
  }
  for (int offset = 16; offset > 0; offset >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, offset));
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < ROUTER_MAX_PER_LANE; ++i) {
    const int e = lane + 32 * i;
    p[i] = e < experts ? expf(p[i] - m) : 0.0f;
    sum += p[i];
  }
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, offset);
  float score[ROUTER_MAX_PER_LANE];
#pragma unroll
  for (int i = 0; i < ROUTER_MAX_PER_LANE; ++i) {
    const int e = lane + 32 * i;
    p[i] = e < experts ? p[i] / sum : 0.0f;
    score[i] = e < experts ? (bias ? p[i] + bias[e] : p[i]) : -FLT_MAX;
  }

  float chosen_sum = 0.0f, chosen_p = 0.0f;
  int chosen_e = 0;
  for (int k = 0; k < top_k; ++k) {
    float best = -FLT_MAX, best_p = 0.0f;
    int best_e = INT32_MAX;
#pragma unroll
    for (int i = 0; i < ROUTER_MAX_PER_LANE; ++i) {
      const int e = lane + 32 * i;
      if (score[i] > best || (score[i] == best && e < best_e)) best = score[i], best_p = p[i], best_e = e;
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
      const float other = __shfl_xor_sync(0xFFFFFFFFu, best, offset);
      const float other_p = __shfl_xor_sync(0xFFFFFFFFu, best_p, offset);
      const int other_e = __shfl_xor_sync(0xFFFFFFFFu, best_e, offset);
      if (other > best || (other == best && other_e < best_e)) best = other, best_p = other_p, best_e = other_e;
    }
#pragma unroll
    for (int i = 0; i < ROUTER_MAX_PER_LANE; ++i)
      if (lane + 32 * i == best_e) score[i] = -FLT_MAX;  // taken
    chosen_sum += best_p;
    if (lane == k) chosen_p = best_p, chosen_e = best_e;
  }
  if (lane < top_k) {
    expert_ids[lane] = chosen_e;
    weights[lane] = renormalize ? chosen_p / fmaxf(chosen_sum, norm_min) : chosen_p;
  }
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
// synchronizes first).
template <int THREADS, int HELD>
__device__ void group_rows(const int32_t* expert_ids, int pairs, int experts, int tile_rows, const ExpertGroups& out,
                           GroupingSmem<THREADS>& sm) {
  const int tid = threadIdx.x;
  int held[HELD];
#pragma unroll
  for (int k = 0; k < HELD; ++k) held[k] = tid + k * THREADS < pairs ? expert_ids[tid + k * THREADS] : -1;
  sm.count[tid] = 0;
  __syncthreads();
#pragma unroll
  for (int k = 0; k < HELD; ++k)
    if (held[k] >= 0) atomicAdd(&sm.count[held[k]], 1);
  for (int i = tid + HELD * THREADS; i < pairs; i += THREADS) atomicAdd(&sm.count[expert_ids[i]], 1);
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
  const auto claim = [&](int i, int expert) {
    const int row = atomicAdd(&sm.cursor[expert], 1);
    out.sorted_pairs[row] = i;
    out.pair_rows[i] = row;
  };
#pragma unroll
  for (int k = 0; k < HELD; ++k)
    if (held[k] >= 0) claim(tid + k * THREADS, held[k]);
  for (int i = tid + HELD * THREADS; i < pairs; i += THREADS) claim(i, expert_ids[i]);
}

}  // namespace nibble::cuda
