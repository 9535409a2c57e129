// The decoder's small ops on the GPU, each the twin of a ref:: op: embedding gather, RMSNorm (with
// the residual add fused in front), per-head q/k RMSNorm + neox RoPE + the paged KV store fused,
// SwiGLU, and BF16 linears on cuBLAS. Activations: the residual stream fp32 [T, H]; GEMM inputs BF16.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace nibble::cuda {

// out[t] = table[ids[t]] as fp32 (ref::embedding). ids < vocab is the caller's check. A pending id
// (models::pending_token(j), negative) reads drawn[j] instead: the token the step before drew.
// Vocabulary-parallel (a tensor-parallel rank): table holds rows [vocab_begin, vocab_begin +
// vocab_rows) and other ids give zeros, so the ranks' sum is the whole embedding.
Status embedding_gather(const int32_t* ids, int64_t tokens, const uint16_t* table, int64_t hidden, float* out,
                        cudaStream_t stream, const int32_t* drawn = nullptr, int64_t vocab_begin = 0,
                        int64_t vocab_rows = INT32_MAX);

// A norm's optional W4A4 output (x_hat null: none): x̂ [rows, width] BF16 of its BF16 output and
// each row's scale, bit for bit what quantize_dequantize_activation_bf16 computes from that output
// (input_scale > 0: static; 0: per-token) — the row is in one CTA already, so no launch of its own.
struct NormActQuant {
  float input_scale = 0.0f;
  uint16_t* x_hat = nullptr;
  float* row_scales = nullptr;
  bool fragment_order = false;  // x_hat's columns in fragment order (nvfp4_layout.h): the wgmma MoE's input
};

// residual += delta (when delta is not null), then out = BF16(rmsnorm(residual) · weight)
// (ref::add_inplace + ref::rmsnorm). rows: when not null, row r reads residual row rows[r] (the
// final norm of the rows that need logits); residual is then read only. quant: x̂ of out as well
// (width a multiple of 16). delta_row_scales (optional, [n_rows]): delta's row r is multiplied by
// delta_row_scales[r] first — a per-token W4A4 GEMM's output left unscaled (linear_nvfp4's
// deferred_row_scales), the same bits as a scaling pass over delta. out_fragment_order (optional): out
// again with each row's columns in fragment order (nvfp4_layout.h; width a multiple of 32), the wgmma
// MoE's input.
Status add_rmsnorm(float* residual, const float* delta, int64_t n_rows, int64_t width, const uint16_t* weight,
                   float eps, uint16_t* out, cudaStream_t stream, const int32_t* rows = nullptr,
                   const NormActQuant& quant = {}, const float* delta_row_scales = nullptr,
                   uint16_t* out_fragment_order = nullptr);

// Where each token of a step goes: its position (RoPE) and its KV-cache slot (block · block_size +
// offset), both per token.
struct QkvLayout {
  int64_t tokens = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  const int32_t* positions = nullptr;  // device [tokens]
  const int64_t* slots = nullptr;      // device [tokens]
  const float* inv_freq = nullptr;     // device [head_dim / 2]: ref::Rope's table
  bool interleaved = false;            // RoPE pairs (2i, 2i + 1) (ERNIE-4.5) instead of (i, i + D/2)
  float rope_scaling = 1.0f;           // cos and sin times this (ref::Rope::attention_scaling)
};

// How q, k and v lie in memory and what still multiplies them: each its own [T, width] array (the
// default), or one GEMM's output [T, row_stride] with q, k, v at column offsets (row_stride > 0), its
// values before the projections' scales (scale[0..2] for q, k, v; and row_scales[t], per-token W4A4,
// when not null) — applied as the GEMM epilogue would have: (y · scale) · row_scale, in fp32.
struct QkvInput {
  const float *q = nullptr, *k = nullptr, *v = nullptr;
  int64_t row_stride = 0;
  float scale[3] = {1.0f, 1.0f, 1.0f};
  const float* row_scales = nullptr;
};

// What the paged KV cache holds: BF16 values, or FP8 E4M3 codes of K / k_scale and V / v_scale (round
// to nearest even, saturating: ref::KvRounding::FP8), half the bytes.
enum class KvFormat { BF16, FP8 };

// q [T, NH·D] and k, v [T, NKV·D] fp32 (the projections, as QkvInput lays them out): per-head RMSNorm of q and k with
// their weights (both null: no norm), neox or interleaved RoPE (layout.inv_freq), then q_out fp32 [T, NH, D] (or, when
// q_out_bf16 is given, q rounded to BF16 there instead: FlashInfer's input) and K/V rounded to BF16 (or FP8 of K /
// k_scale and V / v_scale, kv_format) into the paged cache [blocks, block_size, NKV, D] at each token's slot
// (ref::rmsnorm, ref::rope_neox, ref::kv_store).
Status qk_norm_rope_store(const QkvInput& in, const QkvLayout& layout, const uint16_t* q_norm, const uint16_t* k_norm,
                          float eps, float* q_out, void* k_cache, void* v_cache, cudaStream_t stream,
                          uint16_t* q_out_bf16 = nullptr, KvFormat kv_format = KvFormat::BF16, float k_scale = 1.0f,
                          float v_scale = 1.0f);

// out = BF16(silu(gate) · up) over n values, gate and up fp32 (ref::silu_mul, for dense MLP layers).
Status silu_mul_bf16(const float* gate, const float* up, int64_t n, uint16_t* out, cudaStream_t stream);

// y[M, N] fp32 = x[M, K] BF16 · W[N, K]ᵀ BF16 on cuBLAS with fp32 accumulation (ref::linear_bf16).
Status linear_bf16(const uint16_t* x, int64_t M, const uint16_t* w, int64_t N, int64_t K, float* y,
                   cublasHandle_t cublas);

// fp32 → BF16 (round to nearest even) over n values.
Status to_bf16(const float* x, int64_t n, uint16_t* out, cudaStream_t stream);

}  // namespace nibble::cuda
