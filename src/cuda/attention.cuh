// Paged attention on the GPU: GQA, causal, over a BF16 KV cache [blocks, block_size, NKV, D], for
// mixed steps (prefill chunks attend to their cached pages and causally to each other; decodes to
// their whole context). fp32 scores and online softmax. Twin of ref::paged_attention.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace nibble::cuda {

// Per token of the step: which sequence it belongs to and its position; per sequence: its block
// table (row of a [n_seqs, max_blocks] table).
struct AttentionBatch {
  int64_t tokens = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, block_size = 0;
  const int32_t* token_seq = nullptr;     // device [tokens]
  const int32_t* positions = nullptr;     // device [tokens]: the token attends to positions [0, positions[t]]
  const int32_t* block_tables = nullptr;  // device [n_seqs, max_blocks]
  int64_t max_blocks = 0;
};

// q: fp32 [tokens, NH, D]; out: BF16 [tokens, NH·D] (the o_proj input). head_dim ≤ 256, a
// multiple of 2; n_heads a multiple of n_kv_heads with at most 16 query heads per KV head.
Status paged_attention(const float* q, const uint16_t* k_cache, const uint16_t* v_cache, const AttentionBatch& batch,
                       uint16_t* out, cudaStream_t stream);

}  // namespace nibble::cuda
