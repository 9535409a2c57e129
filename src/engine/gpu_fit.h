// Whether a model's weights fit the GPUs it is given, decided before anything loads: a rank's share
// of the checkpoint (io::partition's plan) and the BF16 copies the GPU model makes of its dense NVFP4
// projections, against what --gpu-memory-utilization leaves of a card. The error says what would fit.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "io/model_config.h"
#include "io/partition.h"
#include "io/quant_config.h"

namespace nibble::engine {

// What a model's weights are left on a card for workspaces and the smallest useful KV cache.
inline constexpr uint64_t GPU_FIT_RESERVE_BYTES = 3ull << 30;

// Bytes of the weights one rank of `group` uploads (rank 0; the ranks' shares are equal), with the
// BF16 copies of dense NVFP4 projections when `bf16_copies`; an error where the layout does not split.
Result<uint64_t> rank_weight_bytes(const io::ModelConfig& config, const io::QuantConfig& quant,
                                   const io::ParallelConfig& group, bool bf16_copies);

// ok, or an error naming the weights' bytes a GPU, the budget, and the smallest
// --tensor-parallel-size (up to 64) whose share fits — and whether this host has that many GPUs.
// ranks_per_card: ranks sharing one card (more ranks than GPUs).
Status check_weights_fit(const io::ModelConfig& config, const io::QuantConfig& quant, const io::ParallelConfig& group,
                         bool bf16_copies, uint64_t card_bytes, double gpu_memory_utilization, int gpus,
                         int ranks_per_card = 1);

}  // namespace nibble::engine
