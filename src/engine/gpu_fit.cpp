// check_weights_fit (gpu_fit.h): sums the rank plan's module bytes, as the upload will allocate them.
#include "engine/gpu_fit.h"

#include <cstdio>

#include "io/partition.h"

namespace nibble::engine {
namespace {

std::string gb(uint64_t bytes) {
  char s[32];
  std::snprintf(s, sizeof(s), "%.1f GB", static_cast<double>(bytes) / 1e9);
  return s;
}

}  // namespace

Result<uint64_t> rank_weight_bytes(const io::ModelConfig& config, const io::QuantConfig& quant,
                                   const io::ParallelConfig& group, bool bf16_copies) {
  auto plan = io::partition(config, quant, {group.size, 0, group.expert_parallel});
  if (!plan) return plan.status();
  uint64_t bytes = 0;
  for (const io::RankModule& placed : plan->modules) {
    const io::ModuleSpec& m = placed.module;
    if (placed.split == io::Split::ABSENT) continue;
    bytes += m.nbytes();
    if (bf16_copies && m.kind == io::ModuleKind::LINEAR && m.quantized && m.expert < 0)
      bytes += static_cast<uint64_t>(m.shape[0] * m.shape[1]) * 2;
  }
  return bytes;
}

Status check_weights_fit(const io::ModelConfig& config, const io::QuantConfig& quant, const io::ParallelConfig& group,
                         bool bf16_copies, uint64_t card_bytes, double gpu_memory_utilization, int gpus,
                         int ranks_per_card) {
  const double share = gpu_memory_utilization * static_cast<double>(card_bytes) / std::max(ranks_per_card, 1);
  const double budget = share - static_cast<double>(GPU_FIT_RESERVE_BYTES);
  const int64_t tensor_parallel_size = group.size;
  auto fits = [&](int64_t n) -> bool {
    auto bytes = rank_weight_bytes(config, quant, {n, 0, group.expert_parallel}, bf16_copies);
    return bytes && static_cast<double>(*bytes) <= budget;
  };
  auto mine = rank_weight_bytes(config, quant, group, bf16_copies);
  if (!mine) return mine.status();
  if (static_cast<double>(*mine) <= budget) return Status::ok();
  char utilization[16];
  std::snprintf(utilization, sizeof(utilization), "%.2f", gpu_memory_utilization);
  std::string msg =
      "the weights need " + gb(*mine) + " a GPU at --tensor-parallel-size " + std::to_string(tensor_parallel_size) +
      "; a " + gb(card_bytes) + " card at --gpu-memory-utilization " + utilization +
      (ranks_per_card > 1 ? " shared by " + std::to_string(ranks_per_card) : std::string()) + " leaves them " +
      gb(uint64_t(std::max(budget, 0.0))) + " (" + gb(GPU_FIT_RESERVE_BYTES) + " kept for workspaces and the KV cache)";
  for (int64_t n = tensor_parallel_size + 1; n <= 64; ++n)
    if (fits(n)) {
      msg += ": --tensor-parallel-size " + std::to_string(n) + " fits" +
             (n <= gpus ? std::string() : " (this host has " + std::to_string(gpus) + " GPU(s))");
      return Status::error(msg);
    }
  return Status::error(msg + ", and no --tensor-parallel-size up to 64 fits");
}

}  // namespace nibble::engine
