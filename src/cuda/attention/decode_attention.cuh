// Decode attention in one launch: every row of the step is one sequence's newest token (decode
// steps, CUDA graphs included), GQA with up to 8 query heads per KV head, head_dim 128, over the
// BF16 paged cache. Each (token, KV head) is split over a cluster of CTAs by its context length and
// the cluster merges the partial softmaxes, so no second launch follows. Twin of ref::paged_attention.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace nibble::cuda {

struct DecodeAttentionBatch {
  int64_t tokens = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, page_size = 0;
  const int32_t* token_seq = nullptr;     // device [tokens]: each row's sequence
  const int32_t* positions = nullptr;     // device [tokens]: the row attends to keys [0, positions[t]]
  const int32_t* block_tables = nullptr;  // device [n_seqs, max_blocks]
  int64_t max_blocks = 0;
  // CTAs per (token, KV head), one cluster, decode_attention_splits(...): fixed per step shape (a
  // graph's grid); each row uses as many as its context fills, at least 128 keys each.
  int64_t splits = 1;
  // Static W4A4 o projection: x̂ of the output as well (BF16 [tokens, n_heads · head_dim]), under
  // the global scale 1 / input_scale, as quantize_dequantize_activation_bf16 would write it.
  uint16_t* x_hat = nullptr;
  float x_hat_global = 0.0f;
};

// Head dim 128, at most 8 query heads per KV head, pages a multiple of 16 tokens.
bool decode_attention_supported(int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, int64_t page_size);
// About two CTAs an SM whatever the contexts (at most 8 per (token, KV head); 1 from 2 · sms rows).
int64_t decode_attention_splits(int64_t tokens, int64_t n_kv_heads, int64_t sms);

// q: BF16 [tokens, n_heads, head_dim] (after RoPE); k_cache / v_cache: one layer's
// [pages, page_size, n_kv_heads, head_dim] BF16; out: BF16 [tokens, n_heads · head_dim].
Status decode_attention(const uint16_t* q, const uint16_t* k_cache, const uint16_t* v_cache,
                        const DecodeAttentionBatch& b, uint16_t* out, cudaStream_t stream);

}  // namespace nibble::cuda
