// Token → expert grouping for the MoE GEMMs: per-expert row counts and offsets, the (token, slot)
// pair at each expert-sorted row and its inverse, and the tile list the grouped GEMMs walk.
// Rows of one expert are contiguous, in pair order (the one-launch decode router's: any order, by
// atomics); the order changes no result: every GEMM row is computed from its own input row alone.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace nibble::cuda {

struct ExpertGroups {
  int32_t* expert_offsets = nullptr;  // [experts + 1]: sorted rows [offsets[e], offsets[e+1]) are expert e's
  int32_t* tile_offsets = nullptr;    // [experts + 1]: GEMM tiles of tile_rows rows, prefix sums per expert
  int32_t* sorted_pairs = nullptr;    // [tokens · top_k]: pair index t·top_k + slot at each sorted row
  int32_t* pair_rows = nullptr;       // [tokens · top_k]: sorted row of each pair (the inverse)
  // [max_expert_tiles(...)]: tile j = (expert, first sorted row, rows) for j < tile_offsets[experts],
  // so a GEMM CTA finds its tile with one load instead of a search over tile_offsets.
  int4* tiles = nullptr;
};

// The most tiles a grouping of `pairs` rows over `experts` experts can produce (a host-side bound for
// grid sizes, so nothing is read back): ceil(pairs / tile_rows) plus one partial tile per expert.
int64_t max_expert_tiles(int64_t pairs, int64_t experts, int64_t tile_rows);

// The multi-CTA grouping that route_topk runs beside the top-k (moe_routing_device.cuh): per
// (expert, CTA) counts and bases, and a ticket counter (0 before the first call; each call leaves it 0).
struct GroupingWorkspace {
  int32_t* counts = nullptr;  // [grouping_workspace_ints(...) / 2]
  int32_t* bases = nullptr;   // the same size
  int* counter = nullptr;
};
// CTAs of the top-k + grouping launch for `tokens` tokens, and the ints counts and bases need together.
int64_t grouping_ctas(int64_t tokens);
int64_t grouping_workspace_ints(int64_t tokens, int64_t experts);

// The grouping's second launch (route_topk runs it when its launch has more than one CTA): every
// pair to its sorted row, by the bases the first launch's scan left.
Status place_pairs(const int32_t* expert_ids, int64_t tokens, int64_t top_k, const ExpertGroups& out,
                   const GroupingWorkspace& ws, cudaStream_t stream);

// The one-CTA grouping (experts ≤ 1024), kept for one A/B measurement.
Status group_by_expert_one_cta(const int32_t* expert_ids, int64_t pairs, int64_t experts, int tile_rows,
                               const ExpertGroups& out, cudaStream_t stream);

}  // namespace nibble::cuda
