// group_by_expert: one CTA of 1,024 threads running group_rows (moe_routing_device.cuh). One launch
// whatever the batch: at T = 1 it is a few microseconds, at 65,536 pairs tens.
#include "cuda/common/check.cuh"
#include "cuda/moe/moe_grouping.cuh"
#include "cuda/moe/moe_routing_device.cuh"
#include "cuda/common/pdl.cuh"

#include <algorithm>

namespace nibble::cuda {
namespace {

constexpr int THREADS = 1024;
constexpr int MAX_EXPERTS = THREADS;
// Pairs whose sorted order is staged in shared memory and copied out in order (group_rows' `staged`):
// 48K pairs, 192 KB beside the counters (T = 6,144 at top-8); more are stored straight to their rows.
constexpr int STAGED_MAX_PAIRS = 48 * 1024;

__global__ void __launch_bounds__(THREADS) group_by_expert_kernel(const int32_t* __restrict__ expert_ids, int pairs,
                                                                  int first, int experts, int tile_rows,
                                                                  ExpertGroups out) {
  __shared__ GroupingSmem<THREADS> sm;
  extern __shared__ int32_t staged[];
  pdl_wait();
  pdl_launch_dependents();
  group_rows<THREADS, 16>(expert_ids, pairs, first, experts, tile_rows, out, sm,
                          pairs <= STAGED_MAX_PAIRS ? staged : nullptr);
}

}  // namespace

int64_t max_expert_tiles(int64_t pairs, int64_t experts, int64_t tile_rows) {
  return (pairs + tile_rows - 1) / tile_rows + std::min(pairs, experts);
}

Status group_by_expert(const int32_t* expert_ids, int64_t tokens, int64_t top_k, int64_t experts, int tile_rows,
                       const ExpertGroups& out, cudaStream_t stream, int64_t first) {
  if (experts < 1 || experts > MAX_EXPERTS)
    return Status::error("group_by_expert: experts = " + std::to_string(experts) + " is not in [1, 1024]");
  if (tile_rows < 1) return Status::error("group_by_expert: tile_rows must be positive");
  if (tokens < 0 || top_k < 1 || tokens * top_k > INT32_MAX) return Status::error("group_by_expert: bad token count");
  if (!expert_ids || !out.expert_offsets || !out.tile_offsets || !out.sorted_pairs || !out.pair_rows || !out.tiles)
    return Status::error("group_by_expert: null pointer");
  // Set once per process, at the largest staging a launch asks for.
  static const cudaError_t limit = cudaFuncSetAttribute(
      group_by_expert_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(STAGED_MAX_PAIRS * sizeof(int32_t)));
  NIB_RETURN_IF_ERROR(cuda_status(limit, "group_by_expert: shared memory"));
  const int pairs = int(tokens * top_k);
  const size_t staging = pairs <= STAGED_MAX_PAIRS ? size_t(pairs) * sizeof(int32_t) : 0;
  return cuda_status(
      launch_pdl(group_by_expert_kernel, 1, THREADS, staging, stream, expert_ids, pairs, int(first), int(experts),
                 tile_rows, out),
      "group_by_expert launch");
}

}  // namespace nibble::cuda
