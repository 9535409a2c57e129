// Paged attention through FlashInfer's FA2 batch-prefill kernels (headers of the pinned
// flashinfer-python wheel that scripts/setup.sh fetches): decode tokens (query length 1, still on
// the tensor cores) and short chunks on FA2, a step's trailing prefill chunks of 64+ tokens on its
// SM90 kernel (a mixed step runs both, side by side on two streams). Only flashinfer_attention*.cu(h)
// include FlashInfer; the rest of nibble sees this class. Twin of ref::paged_attention.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "core/status.h"
#include "cuda/common/device_context.cuh"

namespace nibble::cuda {

// The head dims compiled in (flashinfer_attention.cu instantiates each): BF16 KV 64 and 128, FP8 KV 128.
bool flashinfer_attention_supported(int64_t head_dim, bool kv_fp8 = false);

class FlashInferAttention {
 public:
  struct Shape {
    int64_t n_heads = 0, n_kv_heads = 0, head_dim = 0, page_size = 0;
    bool kv_fp8 = false;  // the cache holds FP8 E4M3 codes (run's k_scale, v_scale; every step on FA2) instead of BF16
  };
  // Workspaces for steps of up to max_rows query rows from up to max_requests sequences holding
  // up to max_pages pages in all (device buffers from the arena, pinned host staging).
  static Result<std::unique_ptr<FlashInferAttention>> create(const Shape& shape, int64_t max_rows, int64_t max_requests,
                                                             int64_t max_pages, DeviceArena& arena);
  ~FlashInferAttention();
  FlashInferAttention(const FlashInferAttention&) = delete;
  FlashInferAttention& operator=(const FlashInferAttention&) = delete;

  // The step, request by request in batch-row order (each request's query rows are consecutive):
  // clear() starts it (in the other of two pinned stagings: the step before may still be copying),
  // its q_rows queries are the last q_rows of its kv_tokens positions (causal), its keys live in the
  // pages block_table[0, ceil(kv_tokens / page_size)).
  void clear();
  Status add(int64_t q_rows, int64_t kv_tokens, const int32_t* block_table);
  // Copies the step's page table to the device and plans the split of the work (host code, then
  // one copy on the stream). graph: a CUDA-graph step (one query row per request): the launch
  // shape then depends on the request count only, so a graph captured after one such plan replays
  // after any other of the same count (plan_info() says whether it matches).
  Status plan(bool graph, cudaStream_t stream);
  std::vector<int64_t> plan_info() const;
  // q BF16 [rows, n_heads, head_dim] → out BF16 [rows, n_heads · head_dim]; k_cache / v_cache: one
  // layer's [pages, page_size, n_kv_heads, head_dim] BF16 (or FP8 codes, Shape::kv_fp8, holding K / k_scale
  // and V / v_scale: the scores are scaled by k_scale, the outputs by v_scale). Uses the last plan.
  Status run(const uint16_t* q, const void* k_cache, const void* v_cache, uint16_t* out, cudaStream_t stream,
             float k_scale = 1.0f, float v_scale = 1.0f) const;

 private:
  struct Impl;
  explicit FlashInferAttention(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace nibble::cuda
