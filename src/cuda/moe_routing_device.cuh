// Device routines shared by the routing kernels: the per-token softmax + top-k of one warp, the
// one-block token → expert grouping (counts, offsets, sorted rows, tile list) of the one-launch
// decode router, and the multi-CTA grouping's scan and placement (route_topk + place_pairs).
#pragma once

#include <cfloat>
#include <cstdint>

#include "cuda/moe_grouping.cuh"

namespace nibble::cuda {

inline constexpr int ROUTER_MAX_PER_LANE = 8;  // experts ≤ 256 in the warp top-k

// One warp: softmax over row[0, experts) (fp32), top-k by k rounds of a warp arg-max on
// (score, −expert) so ties pick the lower expert (torch.topk), where the score is the probability
// plus bias[e] when a bias is given (ERNIE: it chooses, the probabilities weigh), renormalized over
// the k by max(sum, norm_min) when asked. Lane j < top_k writes slot j. `row` may be written by other
// CTAs of the same grid: it is read through L2 (ld.global.cg). Returns lane j < top_k's expert (-1 on others).
__device__ __forceinline__ int warp_softmax_topk(const float* row, int experts, int top_k, bool renormalize,
                                                  const float* bias, float norm_min, int32_t* expert_ids,
                                                  float* weights) {
  const int lane = threadIdx.x & 31;
  float p[ROUTER_MAX_PER_LANE];
  float m = -FLT_MAX;
#pragma unroll
  for (int i = 0; i < ROUTER_MAX_PER_LANE; ++i) {
    const int e = lane + 32 * i;
    p[i] = e < experts ? __ldcg(row + e) : -FLT_MAX;
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
  return lane < top_k ? chosen_e : -1;
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
// atomic. expert_ids may have been written by this block (the caller synchronizes first).
template <int THREADS>
__device__ void group_rows(const int32_t* expert_ids, int pairs, int experts, int tile_rows, const ExpertGroups& out,
                           GroupingSmem<THREADS>& sm) {
  const int tid = threadIdx.x;
  sm.count[tid] = 0;
  __syncthreads();
  for (int i = tid; i < pairs; i += THREADS) atomicAdd(&sm.count[expert_ids[i]], 1);
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
  for (int i = tid; i < pairs; i += THREADS) {
    const int row = atomicAdd(&sm.cursor[expert_ids[i]], 1);
    out.sorted_pairs[row] = i;
    out.pair_rows[i] = row;
  }
}


// The multi-CTA grouping (route_topk with a RouteGrouping, then place_pairs): CTA c of the top-k
// launch owns tokens [GROUP_TOKENS·c, +GROUP_TOKENS) — a warp each — and their pairs, counts them
// per expert into counts[e · ctas + c]; the last CTA to finish scans the counts (bases[e · ctas + c]:
// expert e's rows of CTAs before c) and writes the offsets and the tile list; each CTA's pairs then
// take the rows base + their rank among the CTA's earlier pairs of the same expert. The rows of one
// expert are so in pair order, whatever the timing.
inline constexpr int GROUP_TOKENS = 16;
inline constexpr int GROUP_THREADS = 32 * GROUP_TOKENS;

// Offsets, tile counts and the tile list from per-expert totals (`mine`: thread e's total, e <
// experts); returns thread e's first row. All threads of the block call it.
template <int THREADS>
__device__ int write_expert_tiles(int mine, int experts, int tile_rows, const ExpertGroups& out, int* warp_sums) {
  const int tid = threadIdx.x;
  const int my_tiles = (mine + tile_rows - 1) / tile_rows;
  int total_rows, total_tiles;
  const int row_offset = block_exclusive_scan<THREADS>(mine, warp_sums, &total_rows);
  const int tile_offset = block_exclusive_scan<THREADS>(my_tiles, warp_sums, &total_tiles);
  if (tid < experts) {
    out.expert_offsets[tid] = row_offset;
    out.tile_offsets[tid] = tile_offset;
    for (int j = 0; j < my_tiles; ++j)
      out.tiles[tile_offset + j] = make_int4(tid, row_offset + j * tile_rows, min(tile_rows, mine - j * tile_rows), 0);
  }
  if (tid == 0) {
    out.expert_offsets[experts] = total_rows;
    out.tile_offsets[experts] = total_tiles;
  }
  return row_offset;
}

// A grid of one CTA: its pairs' experts ids[0, n) and per-expert counts count[] in shared memory;
// offsets, tiles and rows (pair order within an expert) with no global round trip. first: shared
// [experts], the experts' first rows.
template <int THREADS>
__device__ void group_one_cta(const int* ids, int n, const int* count, int experts, int tile_rows, const ExpertGroups& out,
                              int* first, int* warp_sums) {
  const int tid = threadIdx.x;
  const int row_offset = write_expert_tiles<THREADS>(tid < experts ? count[tid] : 0, experts, tile_rows, out, warp_sums);
  if (tid < experts) first[tid] = row_offset;
  __syncthreads();
  if (tid >= n) return;
  const int e = ids[tid];
  int rank = 0;
  for (int j = 0; j < tid; ++j) rank += ids[j] == e;
  out.sorted_pairs[first[e] + rank] = tid;
  out.pair_rows[tid] = first[e] + rank;
}

// The last CTA of several: bases[e · ctas + c] = expert e's rows of CTAs before c, then the offsets
// and tiles. `per` threads share an expert (a power of two ≤ 32: a shuffle segment), each summing a
// run of CTAs with all its loads in flight (a warp per expert walking the CTAs in order paid an L2
// round trip per 32 CTAs and per expert). totals: shared [experts].
template <int THREADS>
__device__ void scan_expert_counts(const int32_t* __restrict__ counts, int32_t* __restrict__ bases, int ctas, int experts,
                                   int tile_rows, const ExpertGroups& out, int* totals, int* warp_sums) {
  constexpr int BATCH = 16;
  const int tid = threadIdx.x;
  int per = 32;
  while (per > 1 && per * experts > THREADS) per >>= 1;
  const int e = tid / per, part = tid % per;
  const bool active = e < experts;
  const int len = (ctas + per - 1) / per, begin = min(ctas, part * len), end = min(ctas, begin + len);
  const int32_t* row = counts + size_t(active ? e : 0) * ctas;
  int first[BATCH], sum = 0;  // the first batch is kept for the second pass
#pragma unroll
  for (int i = 0; i < BATCH; ++i) first[i] = active && begin + i < end ? __ldcg(row + begin + i) : 0;
#pragma unroll
  for (int i = 0; i < BATCH; ++i) sum += first[i];
  for (int c0 = begin + BATCH; c0 < end; c0 += BATCH) {
    int v[BATCH];
#pragma unroll
    for (int i = 0; i < BATCH; ++i) v[i] = active && c0 + i < end ? __ldcg(row + c0 + i) : 0;
#pragma unroll
    for (int i = 0; i < BATCH; ++i) sum += v[i];
  }
  int inclusive = sum;
  for (int offset = 1; offset < per; offset <<= 1) {
    const int up = __shfl_up_sync(0xFFFFFFFFu, inclusive, offset, per);
    if (part >= offset) inclusive += up;
  }
  if (active && part == per - 1) totals[e] = inclusive;
  if (active) {
    int running = inclusive - sum;
    int32_t* base = bases + size_t(e) * ctas;
#pragma unroll
    for (int i = 0; i < BATCH; ++i)
      if (begin + i < end) base[begin + i] = running, running += first[i];
    for (int c0 = begin + BATCH; c0 < end; c0 += BATCH) {
      int v[BATCH];
#pragma unroll
      for (int i = 0; i < BATCH; ++i) v[i] = c0 + i < end ? __ldcg(row + c0 + i) : 0;
#pragma unroll
      for (int i = 0; i < BATCH; ++i)
        if (c0 + i < end) base[c0 + i] = running, running += v[i];
    }
  }
  __syncthreads();
  write_expert_tiles<THREADS>(tid < experts ? totals[tid] : 0, experts, tile_rows, out, warp_sums);
}

// CTA `cta`'s pairs [first, first + n) (n ≤ blockDim.x) to their rows, after the scan. ids: shared
// [blockDim.x]. Reads expert_offsets and bases through L2 (this CTA may have just written them).
__device__ __forceinline__ void place_cta_pairs(const int32_t* expert_ids, int first, int n, int cta, int ctas,
                                                const int32_t* bases, const ExpertGroups& out, int* ids) {
  const int i = threadIdx.x;
  const int e = i < n ? expert_ids[first + i] : -1;
  ids[i] = e;
  __syncthreads();
  if (i >= n) return;
  int rank = 0;
  for (int j = 0; j < i; ++j) rank += ids[j] == e;
  const int row = __ldcg(out.expert_offsets + e) + __ldcg(bases + size_t(e) * ctas + cta) + rank;
  out.sorted_pairs[row] = first + i;
  out.pair_rows[first + i] = row;
}

}  // namespace nibble::cuda
