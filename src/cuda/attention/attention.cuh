// Paged attention on the GPU: GQA, causal, over a BF16 KV cache [blocks, block_size, NKV, D], for
// mixed steps (prefill chunks attend to their cached pages and causally to each other; decodes to
// their whole context, split over CTAs when few tokens run). fp32 scores and online softmax. Twin
// of ref::paged_attention.
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
  int64_t splits = 1;  // per-token kernel: CTAs per (token, KV head), attention_splits(...)
  // Optional (eager steps with prefill chunks): the tensor-core kernel takes the prefill items —
  // runs of up to prefill_item_tokens(group) consecutive tokens of one sequence, as (sequence,
  // first batch row, tokens, first position) — and the per-token kernel only the decode tokens.
  const int4* prefill_items = nullptr;  // device [n_items]
  int64_t n_items = 0;
  const int32_t* decode_tokens = nullptr;  // device [n_decode] batch rows; null: every token
  int64_t n_decode = 0;
};

// The tensor-core prefill kernel's shapes: head_dim 64 or 128, a query group of at most 16.
bool prefill_attention_supported(int64_t head_dim, int64_t group);
int64_t prefill_item_tokens(int64_t group);  // tokens per item: 128 query rows / group, rounded down
// The prefill items alone (paged_attention calls it when batch.n_items > 0).
Status prefill_attention(const float* q, const uint16_t* k_cache, const uint16_t* v_cache, const AttentionBatch& batch,
                         uint16_t* out, cudaStream_t stream);

// Decode-sized steps split each token's context evenly over several CTAs (flash-decoding) and merge
// the partial softmaxes: enough CTAs for four waves of the GPU, none with fewer than 64 keys
// (max_keys: the longest context in the step; 0 when unknown, e.g. for a captured graph).
int64_t attention_splits(int64_t tokens, int64_t n_kv_heads, int64_t max_keys);
// The fp32 scratch split steps need: tokens · n_heads · splits · (head_dim + 2) floats (tokens: those
// the per-token kernel runs).
inline int64_t attention_workspace_floats(int64_t tokens, int64_t n_heads, int64_t head_dim, int64_t splits) {
  return tokens * n_heads * splits * (head_dim + 2);
}

// q: fp32 [tokens, NH, D]; out: BF16 [tokens, NH·D] (the o_proj input). head_dim ≤ 256, a
// multiple of 2; n_heads a multiple of n_kv_heads with at most 16 query heads per KV head.
// workspace: attention_workspace_floats(...) floats when batch.splits > 1 (may be null at 1).
Status paged_attention(const float* q, const uint16_t* k_cache, const uint16_t* v_cache, const AttentionBatch& batch,
                       uint16_t* out, cudaStream_t stream, float* workspace = nullptr);

}  // namespace nibble::cuda
