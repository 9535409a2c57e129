// group_by_expert: one CTA of 1,024 threads — a shared-memory histogram, a block-wide exclusive scan
// of the counts (and of their tile counts), then each pair claims its row with a shared atomic.
// One launch whatever the batch: at T = 1 it is a few microseconds, at 65,536 pairs tens.
#include "cuda/check.cuh"
#include "cuda/moe_grouping.cuh"

#include <algorithm>

namespace nibble::cuda {
namespace {

constexpr int THREADS = 1024;
constexpr int MAX_EXPERTS = THREADS;

// Exclusive scan of one value per thread over the block; returns the thread's prefix, total in *total.
__device__ int block_exclusive_scan(int value, int* warp_sums, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int inclusive = value;
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int up = __shfl_up_sync(0xFFFFFFFFu, inclusive, offset);
    if (lane >= offset) inclusive += up;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    int s = warp_sums[lane];
    for (int offset = 1; offset < 32; offset <<= 1) {
      const int up = __shfl_up_sync(0xFFFFFFFFu, s, offset);
      if (lane >= offset) s += up;
    }
    warp_sums[lane] = s;  // inclusive sums of warps
  }
  __syncthreads();
  const int before = (warp > 0 ? warp_sums[warp - 1] : 0) + inclusive - value;
  *total = warp_sums[31];
  __syncthreads();
  return before;
}

__global__ void __launch_bounds__(THREADS)
    group_by_expert_kernel(const int32_t* __restrict__ expert_ids, int pairs, int experts, int tile_rows,
                           ExpertGroups out) {
  __shared__ int count[MAX_EXPERTS];
  __shared__ int cursor[MAX_EXPERTS];
  __shared__ int warp_sums[32];
  const int tid = threadIdx.x;
  count[tid] = 0;
  __syncthreads();
  for (int i = tid; i < pairs; i += THREADS) atomicAdd(&count[expert_ids[i]], 1);
  __syncthreads();
  const int mine = tid < experts ? count[tid] : 0;
  int total_rows, total_tiles;
  const int row_offset = block_exclusive_scan(mine, warp_sums, &total_rows);
  const int tile_offset = block_exclusive_scan((mine + tile_rows - 1) / tile_rows, warp_sums, &total_tiles);
  if (tid < experts) {
    out.expert_offsets[tid] = row_offset;
    out.tile_offsets[tid] = tile_offset;
    cursor[tid] = row_offset;
  }
  if (tid == 0) {
    out.expert_offsets[experts] = total_rows;
    out.tile_offsets[experts] = total_tiles;
  }
  __syncthreads();
  for (int i = tid; i < pairs; i += THREADS) {
    const int row = atomicAdd(&cursor[expert_ids[i]], 1);
    out.sorted_pairs[row] = i;
    out.pair_rows[i] = row;
  }
}

}  // namespace

int64_t max_expert_tiles(int64_t pairs, int64_t experts, int64_t tile_rows) {
  return (pairs + tile_rows - 1) / tile_rows + std::min(pairs, experts);
}

Status group_by_expert(const int32_t* expert_ids, int64_t tokens, int64_t top_k, int64_t experts, int tile_rows,
                       const ExpertGroups& out, cudaStream_t stream) {
  if (experts < 1 || experts > MAX_EXPERTS)
    return Status::error("group_by_expert: experts = " + std::to_string(experts) + " is not in [1, 1024]");
  if (tile_rows < 1) return Status::error("group_by_expert: tile_rows must be positive");
  if (tokens < 0 || top_k < 1 || tokens * top_k > INT32_MAX) return Status::error("group_by_expert: bad token count");
  if (!expert_ids || !out.expert_offsets || !out.tile_offsets || !out.sorted_pairs || !out.pair_rows)
    return Status::error("group_by_expert: null pointer");
  group_by_expert_kernel<<<1, THREADS, 0, stream>>>(expert_ids, int(tokens * top_k), int(experts), tile_rows, out);
  return cuda_status(cudaGetLastError(), "group_by_expert launch");
}

}  // namespace nibble::cuda
