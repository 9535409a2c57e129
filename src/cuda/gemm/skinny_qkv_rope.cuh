// q/k/v of a decode step's few tokens with the per-head q/k RMSNorm, RoPE and KV store in the same
// launch: the skinny dense GEMM's tiles of one head are a thread-block cluster, whose first CTA
// gathers the head's rows from the others' shared memory and runs qk_norm_rope_store's head code.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"
#include "cuda/gemm/linear_nvfp4.cuh"
#include "cuda/ops/transformer_ops.cuh"

namespace nibble::cuda {

inline constexpr int64_t QKV_ROPE_MAX_M = 8;  // one n-tile of token columns

// Whether skinny_qkv_rope_store takes these shapes: M ≤ QKV_ROPE_MAX_M tokens, head_dim 64 or 128
// (a head's m16 tiles are one cluster of ≤ 8 CTAs), in_features a multiple of 128 up to SKINNY_MAX_K
// (one launch spans k).
bool skinny_qkv_rope_supported(int64_t M, int64_t in_features, int64_t head_dim);

// What the epilogue does with the head rows, as qk_norm_rope_store's arguments (q into q_out_bf16).
struct QkvRopeStore {
  QkvLayout layout;
  const uint16_t *q_norm = nullptr, *k_norm = nullptr;  // both null: no q/k norm
  float eps = 0.0f;
  uint16_t* q_out_bf16 = nullptr;  // [M, NH, D]
  void *k_cache = nullptr, *v_cache = nullptr;
  KvFormat kv_format = KvFormat::BF16;
  float k_scale = 1.0f, v_scale = 1.0f;
};

// skinny_linear(x, M, {q, k, v}, …, row_scales) followed by qk_norm_rope_store(…, q_out_bf16, …) on its
// fp32 outputs, bit for bit, in one launch; the fp32 q/k/v rows are never written. row_scales: the
// x̂ rows' scales (W4A4, x already quantized) or null.
Status skinny_qkv_rope_store(const uint16_t* x, int64_t M, const DeviceNvfp4Weight* const* qkv, const float* row_scales,
                             const QkvRopeStore& out, cudaStream_t stream);

}  // namespace nibble::cuda
