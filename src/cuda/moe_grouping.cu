// The multi-CTA grouping's placement launch (place_pairs) and the host-side sizes of the grouping:
// a CTA per GROUP_TOKENS tokens places its pairs at the bases route_topk's last CTA scanned.
#include "cuda/check.cuh"
#include "cuda/moe_grouping.cuh"
#include "cuda/moe_routing_device.cuh"
#include "cuda/pdl.cuh"

#include <algorithm>

namespace nibble::cuda {
namespace {

__global__ void __launch_bounds__(GROUP_THREADS)
    place_pairs_kernel(const int32_t* __restrict__ expert_ids, int pairs, int top_k, ExpertGroups out,
                       const int32_t* __restrict__ bases) {
  __shared__ int ids[GROUP_THREADS];
  pdl_wait();
  pdl_launch_dependents();
  const int first = int(blockIdx.x) * GROUP_TOKENS * top_k;
  place_cta_pairs(expert_ids, first, min(GROUP_TOKENS * top_k, pairs - first), int(blockIdx.x), int(gridDim.x), bases, out,
                  ids);
}

// The one-CTA grouping the multi-CTA one replaced, kept for one measurement (NIBBLE_ONE_CTA_GROUPING=1).
__global__ void __launch_bounds__(1024)
    group_by_expert_kernel(const int32_t* __restrict__ expert_ids, int pairs, int experts, int tile_rows,
                           ExpertGroups out) {
  __shared__ GroupingSmem<1024> sm;
  pdl_wait();
  pdl_launch_dependents();
  group_rows<1024>(expert_ids, pairs, experts, tile_rows, out, sm);
}

}  // namespace

Status group_by_expert_one_cta(const int32_t* expert_ids, int64_t pairs, int64_t experts, int tile_rows,
                               const ExpertGroups& out, cudaStream_t stream) {
  return cuda_status(launch_pdl(group_by_expert_kernel, 1, 1024, 0, stream, expert_ids, int(pairs), int(experts), tile_rows, out),
                     "group_by_expert launch");
}

int64_t max_expert_tiles(int64_t pairs, int64_t experts, int64_t tile_rows) {
  return (pairs + tile_rows - 1) / tile_rows + std::min(pairs, experts);
}

int64_t grouping_ctas(int64_t tokens) { return (tokens + GROUP_TOKENS - 1) / GROUP_TOKENS; }

int64_t grouping_workspace_ints(int64_t tokens, int64_t experts) { return 2 * experts * std::max<int64_t>(grouping_ctas(tokens), 1); }

Status place_pairs(const int32_t* expert_ids, int64_t tokens, int64_t top_k, const ExpertGroups& out,
                   const GroupingWorkspace& ws, cudaStream_t stream) {
  if (tokens <= 0) return Status::ok();
  if (top_k < 1 || top_k * GROUP_TOKENS > GROUP_THREADS || tokens * top_k > INT32_MAX)
    return Status::error("place_pairs: top_k must be in [1, 32] and tokens · top_k below 2^31");
  if (!expert_ids || !ws.bases || !out.expert_offsets || !out.sorted_pairs || !out.pair_rows)
    return Status::error("place_pairs: null pointer");
  return cuda_status(launch_pdl(place_pairs_kernel, unsigned(grouping_ctas(tokens)), GROUP_THREADS, 0, stream, expert_ids,
                                int(tokens * top_k), int(top_k), out, static_cast<const int32_t*>(ws.bases)),
                     "place_pairs launch");
}

}  // namespace nibble::cuda
