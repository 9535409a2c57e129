// CPU reference ops: plain loops, fp32 math and accumulation, the oracle every CUDA op is checked
// against. Activations are row-major fp32 [n_tokens, width]; weights are as the checkpoint stores
// them (BF16 bits or NVFP4 views). Each op names its Hugging Face counterpart.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/status.h"
#include "formats/nvfp4.h"

namespace nibble::ref {

// out[t] = table[ids[t]] (BF16 table [vocab, hidden]); ids must be < vocab (checked by callers).
void embedding(const int32_t* ids, int64_t n_tokens, const uint16_t* table, int64_t hidden, float* out);

// Qwen3RMSNorm over each row of `width`: x · rsqrt(mean(x²) + eps) · weight. In place allowed.
void rmsnorm(const float* x, int64_t n_rows, int64_t width, const uint16_t* weight, float eps, float* out);

// inv_freq[i] = theta^(-2i/head_dim) in double, then fp32, as transformers' default rope init
// computes it (i < head_dim / 2).
std::vector<float> rope_inv_freq(double theta, int64_t head_dim);

// A model's RoPE: each pair's frequency and the factor cos and sin multiply by (YaRN's attention
// factor, else 1); models/rope.h makes it from the config, and the GPU forward uploads the same table.
struct Rope {
  std::vector<float> inv_freq;  // [head_dim / 2]
  float attention_scaling = 1.0f;
};

// Neox-style RoPE (transformers rotate_half) on [n_tokens, n_heads, head_dim] in place: pairs (i,
// i + head_dim/2) rotate by position · inv_freq[i], cos and sin times attention_scaling (fp32).
void rope_neox(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const int64_t* positions,
               const Rope& rope);

// Interleaved RoPE (ERNIE-4.5: transformers' rotate_half on x[0::2], x[1::2] with cos/sin repeated
// per pair): dimensions 2i and 2i + 1 rotate together by position · inv_freq[i].
void rope_interleaved(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const int64_t* positions,
                      const Rope& rope);

// y = x @ W^T for a BF16 W [out, in] (router, lm_head, unquantized projections).
void linear_bf16(const float* x, int64_t n_tokens, const uint16_t* w, int64_t out_features, int64_t in_features,
                 float* y);

// A Linear's weight [out_features, in_features] as the checkpoint holds it: BF16, or NVFP4.
struct LinearWeight {
  int64_t out_features = 0;
  int64_t in_features = 0;
  const uint16_t* bf16 = nullptr;  // BF16 weight; when null, nvfp4 holds the weight
  formats::Nvfp4WeightView nvfp4;
  bool is_nvfp4() const { return bf16 == nullptr; }
};

// A row-parallel linear's per-token amax across its ranks: each row's amax over the rank's columns in,
// the whole row's out (Collectives::all_reduce_max). Empty on one rank.
using RowAmaxReduce = std::function<Status(std::span<float> row_amax)>;

// y = x @ W^T: linear_bf16 or linear_nvfp4 by the weight's format (mode applies to NVFP4 only).
Status linear(const float* x, int64_t n_tokens, const LinearWeight& w, formats::ActQuant mode, float input_scale,
              float* y, const RowAmaxReduce& reduce_amax = {});

// y = x @ W^T for an NVFP4 W in the given activation mode (docs/numerics.md):
//  NONE       y = weight_scale_2 · (x · Ŵ)                     (W4A16)
//  STATIC     y = input_scale · weight_scale_2 · (x̂ · Ŵ), x̂ quantized with G = 1/input_scale
//  PER_TOKEN  y_t = token_scale_t · weight_scale_2 · (x̂_t · Ŵ), token scales from reduce_amax's rows
//             where x is a slice of the columns
// where Ŵ = e2m1 · e4m3 (exact) and x̂ the Blackwell-quantized activations, unscaled.
Status linear_nvfp4(const float* x, int64_t n_tokens, const formats::Nvfp4WeightView& w, formats::ActQuant mode,
                    float input_scale, float* y, const RowAmaxReduce& reduce_amax = {});

// SwiGLU: out = silu(gate) · up, elementwise over n values.
void silu_mul(const float* gate, const float* up, int64_t n, float* out);

// out += x over n values.
void add_inplace(float* out, const float* x, int64_t n);

}  // namespace nibble::ref
