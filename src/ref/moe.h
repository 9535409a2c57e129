// CPU reference Mixture-of-Experts block (transformers Qwen3MoeSparseMoeBlock, and the routed part of
// Ernie4_5_MoeSparseMoeBlock): fp32 softmax router → top-k (ERNIE: on probabilities + a per-expert
// correction bias) → renormalize (norm_topk_prob; ERNIE divides by max(sum, norm_min)) → per expert
// SwiGLU MLP → routing-weighted sum. ERNIE's shared experts are a dense MLP the model adds.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "formats/nvfp4.h"
#include "ref/ops.h"

namespace nibble::ref {

struct ExpertWeights {
  LinearWeight gate, up, down;  // gate/up [I, H], down [H, I] (I: this rank's part under tensor parallelism)
  bool present = true;          // false: another rank's expert (expert parallelism); its tokens add nothing here
};

struct MoeWeights {
  const uint16_t* router = nullptr;   // BF16 [n_experts, hidden] (ModelOpt leaves it unquantized) ...
  const float* router_f32 = nullptr;  // ... or fp32 (ERNIE-4.5 keeps its router in fp32)
  const float* score_bias = nullptr;  // [n_experts]: added to the probabilities for the choice only (ERNIE)
  float norm_min = 0.0f;              // renormalization divides by max(Σ top-k, norm_min)
  int64_t n_experts = 0;
  int64_t top_k = 0;
  int64_t hidden = 0;
  int64_t intermediate = 0;
  bool norm_topk_prob = true;
  std::vector<ExpertWeights> experts;
  // Static mode: one input scale for all experts' gate/up inputs and one for all down inputs,
  // the maximum over experts (as the Blackwell MoE kernels and vLLM/SGLang do).
  float gate_up_input_scale = 0.0f;
  float down_input_scale = 0.0f;
  // Round what the GPU kernels store in BF16: the SwiGLU output in W4A16 (W4A4 re-quantizes it from
  // fp32) and every expert's down output before the combine (for GPU-numerics comparisons).
  bool bf16_intermediates = false;
};

// Called with every expert projection's input (rows = that expert's tokens) before it is used;
// calibration records amax here. Stage is "gate_up" or "down".
using MoeInputObserver =
    std::function<void(int64_t expert, const char* stage, const float* x, int64_t rows, int64_t width)>;

// Router probabilities after top-k selection: expert ids and weights per token, in top-k order.
void route(const float* x, int64_t n_tokens, const MoeWeights& w, int32_t* expert_ids, float* weights);

// out = MoE(x), [n_tokens, hidden]: route, then moe_experts. Modes as in linear_nvfp4; per-token
// quantizes gate/up inputs per token and down inputs per (token, expert) row.
Status moe(const float* x, int64_t n_tokens, const MoeWeights& w, formats::ActQuant mode, float* out,
           const MoeInputObserver& observer = {}, const RowAmaxReduce& reduce_down_amax = {});

// The expert part alone, with the routing given (expert_ids/weights [n_tokens, top_k] as route gives).
// On a rank of a parallel group `out` is this rank's partial sum (its experts, or its slice of every
// expert's width), which the model all-reduces; reduce_down_amax gives per-token mode the whole
// (token, expert) row's amax where the down inputs are a slice of the width (tensor parallelism).
Status moe_experts(const float* x, int64_t n_tokens, const MoeWeights& w, formats::ActQuant mode,
                   const int32_t* expert_ids, const float* route_weights, float* out,
                   const MoeInputObserver& observer = {}, const RowAmaxReduce& reduce_down_amax = {});

}  // namespace nibble::ref
