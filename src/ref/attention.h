// CPU reference attention over a paged KV cache: GQA, causal, fp32 scores and softmax
// (transformers eager_attention_forward). Sequences of a batch attend only to their own blocks.
#pragma once

#include <cstdint>

namespace nibble::ref {

// How a KV cache rounds what it stores: not at all (the fp32 reference), to BF16, or to FP8 E4M3 of
// x / scale (round to nearest even, saturating at ±448: __nv_cvt_float_to_fp8 with __NV_SATFINITE,
// straight from the fp32 value, as the GPU's KV store writes it), read back as code · scale.
enum class KvRounding { NONE, BF16, FP8 };

// A value as a KV cache of that rounding holds it (scale: FP8's; 1 without calibrated scales).
float kv_round(float x, KvRounding rounding, float scale = 1.0f);

// One layer's KV cache: k and v are [n_blocks, block_size, n_kv_heads, head_dim] fp32.
struct PagedKvLayer {
  float* k = nullptr;
  float* v = nullptr;
  int64_t n_blocks = 0;
  int64_t block_size = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  KvRounding rounding = KvRounding::NONE;  // what the stored values are rounded to (the cache's numerics)
  float k_scale = 1.0f, v_scale = 1.0f;    // FP8: the checkpoint's calibrated scales (ModelOpt k/v_scale)
};

// The tokens of one sequence in a step: rows [token_offset, token_offset + n_tokens) of the batch,
// at positions start_position + i; block_table maps logical block j to a physical block.
struct AttentionSequence {
  const int32_t* block_table = nullptr;
  int64_t n_table_blocks = 0;
  int64_t start_position = 0;
  int64_t n_tokens = 0;
  int64_t token_offset = 0;
};

// Writes k, v rows ([n_tokens, n_kv_heads·head_dim]) of the sequence's new tokens into the cache.
void kv_store(const PagedKvLayer& kv, const AttentionSequence& seq, const float* k, const float* v);

// out[t] = softmax(q_t·K^T / sqrt(head_dim), causal) · V for every token of every sequence.
// q: [n_tokens_total, n_heads, head_dim]; out: same shape. Query head h reads KV head
// h / (n_heads / n_kv_heads) (transformers repeat_kv).
void paged_attention(const float* q, int64_t n_heads, const PagedKvLayer& kv, const AttentionSequence* seqs,
                     int64_t n_seqs, float* out);

}  // namespace nibble::ref
