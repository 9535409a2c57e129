// Token → expert grouping for the MoE GEMMs: per-expert row counts and offsets, the (token, slot)
// pair at each expert-sorted row and its inverse, and the tile list the grouped GEMMs walk.
// Rows of one expert are contiguous; their order inside the expert is not fixed (atomics), which
// changes no result: every GEMM row is computed from its own input row alone.
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

// expert_ids: [tokens, top_k] (the router's output). One CTA; experts ≤ 1024. The experts grouped are
// [first, first + experts) under ids from 0 (expert parallelism: a rank's own); pairs of others get
// pair_rows -1 and no sorted row.
Status group_by_expert(const int32_t* expert_ids, int64_t tokens, int64_t top_k, int64_t experts, int tile_rows,
                       const ExpertGroups& out, cudaStream_t stream, int64_t first = 0);

}  // namespace nibble::cuda
