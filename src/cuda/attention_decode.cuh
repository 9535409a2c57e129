// The attention half of a decode layer for one token in one launch (single-stream decode): q/k/v
// projection (NVFP4; W4A16 or either W4A4 mode), per-head q/k RMSNorm + RoPE, the new token's K/V into the paged cache,
// GQA attention split over every SM, the splits' merge, and the o projection — where the kernel
// chain (skinny q/k/v, qk_norm_rope_store, attention, skinny o_proj) waited on four launches. Twin of
// that chain (and so of ref::linear_nvfp4, ref::rmsnorm, ref::rope_*, ref::kv_store, ref::paged_attention).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/status.h"
#include "cuda/linear_nvfp4.cuh"
#include "formats/nvfp4.h"

namespace nibble::cuda {

struct AttentionDecodeWeights {
  const DeviceNvfp4Weight *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  const uint16_t *q_norm = nullptr, *k_norm = nullptr;  // BF16 [head_dim] each, or both null: no q/k norm
  float o_input_scale = 0.0f;                           // static W4A4: the o projection's input scale
};

// The one token's step: its position, KV slot and sequence (device scalars, staged before the
// launch), the paged cache's shape and RoPE.
struct AttentionDecodeStep {
  int64_t hidden = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, page_size = 0;
  const int32_t* positions = nullptr;     // device [1]: the token attends to keys [0, positions[0]]
  const int64_t* slots = nullptr;         // device [1]: its KV-cache slot
  const int32_t* token_seq = nullptr;     // device [1]: its sequence's row of block_tables
  const int32_t* block_tables = nullptr;  // device [n_seqs, max_blocks]
  int64_t max_blocks = 0;
  const float* inv_freq = nullptr;        // device [head_dim / 2]: ref::rope_inv_freq's table
  bool interleaved = false;               // RoPE pairs (2i, 2i + 1) instead of (i, i + D/2)
  float eps = 1e-6f;                      // the q/k norms'
  // The dense layers' activation mode. W4A4: x is the input norm's x̂ and x_row_scale (device [1])
  // its row scale (NormActQuant's), and the o projection quantizes its input as linear_nvfp4 does.
  formats::ActQuant act_quant = formats::ActQuant::NONE;
  const float* x_row_scale = nullptr;
};

// Device scratch of the launch: sizes from attention_decode_workspace_floats; barrier: two words,
// zeroed once (the launches count generations on it).
struct AttentionDecodeWorkspace {
  float* scratch = nullptr;  // the q/k/v projections, then the splits' partial softmaxes
  uint16_t* attn = nullptr;  // BF16 [n_heads · head_dim]: the attention output (the o projection's input)
  unsigned* barrier = nullptr;
};
int64_t attention_decode_workspace_floats(const AttentionDecodeStep& step);

// Whether these weights and shapes fit the one-launch kernel on this GPU: NVFP4 q/k/v/o (static
// W4A4: with an o input scale), head_dim 128, at most 8 query heads per KV head, hidden / 16 CTAs no
// more than the SMs, pages of a multiple of 16 tokens.
bool attention_decode_block_supported(const AttentionDecodeWeights& w, const AttentionDecodeStep& step);
// Whether the runner takes it: NIBBLE_ATTENTION_DECODE_BLOCK=1. Off by default until it has been run
// and measured on the device (written in a session without device time; docs/perf.md).
bool attention_decode_block_enabled();

// x: BF16 [hidden] (the layer's input norm, or its x̂); out: fp32 [hidden], the o projection's output (what
// linear_nvfp4 writes); k_cache / v_cache: the layer's [pages, page_size, n_kv_heads, head_dim] BF16.
Status attention_decode_block(const uint16_t* x, const AttentionDecodeWeights& w, const AttentionDecodeStep& step,
                              uint16_t* k_cache, uint16_t* v_cache, const AttentionDecodeWorkspace& ws, float* out,
                              cudaStream_t stream);

// With NIBBLE_DECODE_BLOCK_TIMING=1, the last launch's time in each phase (SM clock stamps of every
// CTA: median and max), synchronizing the device; "" otherwise.
std::string attention_decode_block_timing(int64_t hidden);

}  // namespace nibble::cuda
