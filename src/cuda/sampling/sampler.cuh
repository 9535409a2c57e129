// Token sampling on the GPU, the twin of sampling::sample_next: min_tokens and grammar masks, logit_bias, repetition /
// presence / frequency penalties, greedy or temperature → min_p → top_k → top_p → the exponential
// race keyed by Philox(seed; position, token), and raw-distribution logprobs with their top k. A
// cluster of CTAs per row; the same logits, seed and position give the CPU sampler's token.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/status.h"

namespace nibble::cuda {

inline constexpr int MAX_TOP_LOGPROBS = 20;

// One row's parameters; its token lists live in SamplerBatch::tokens.
struct SamplerRow {
  float temperature = 1.0f;  // < 1e-5: greedy
  int32_t top_k = 0;
  float top_p = 1.0f, min_p = 0.0f;
  float repetition_penalty = 1.0f, presence_penalty = 0.0f, frequency_penalty = 0.0f;
  uint64_t seed = 0, position = 0;
  int32_t logprobs = -1;                                      // -1 none, else the top count (≤ MAX_TOP_LOGPROBS)
  int32_t prompt_offset = 0, prompt_len = 0, output_len = 0;  // output follows the prompt in tokens
  int32_t masked_offset = 0, masked_len = 0;
  int32_t bias_offset = 0, bias_len = 0;  // logit_bias: tokens in SamplerBatch::tokens, values in bias_values
  int32_t score_token = -1;               // >= 0: draw nothing, give this token's logprob (a prompt position)
  int32_t mask_row = -1;                  // >= 0: structured output, draw only tokens allowed by that mask row
};

struct SamplerBatch {
  int64_t rows = 0, vocab = 0;
  const float* logits = nullptr;       // [rows, vocab]
  const SamplerRow* params = nullptr;  // device [rows]
  // Device: every row's prompt, output and masked tokens. Pending ids (models::pending_token(j),
  // negative) are replaced in place by drawn[j], the token the step before drew for its row j.
  int32_t* tokens = nullptr;
  const int32_t* drawn = nullptr;
  int32_t* out_tokens = nullptr;      // [rows]
  float* out_logprobs = nullptr;      // [rows]
  int32_t* out_top_tokens = nullptr;  // [rows, MAX_TOP_LOGPROBS]
  float* out_top_logprobs = nullptr;  // [rows, MAX_TOP_LOGPROBS]
  // Device, indexed as tokens: each logit_bias token's value (null: no row has any).
  const float* bias_values = nullptr;
  // Device [mask rows, mask_words]: structured output's allowed tokens (bit t % 32 of word t / 32), the
  // rows' mask_row; null when no row is constrained.
  const uint32_t* allowed = nullptr;
  int64_t mask_words = 0;
};

Status sample_rows(const SamplerBatch& batch, cudaStream_t stream);

// Loads the sampler's kernel and opts it into the shared memory of a `vocab`-token row, before any
// launch. CUDA loads a kernel lazily, at its first launch, and that load may wait for the device to
// drain: a sampler first launched behind a wait_for_host (host_wait.cuh) would block the very thread
// that must answer the wait (CUDA programming guide, "Lazy Loading", potential hazards).
Status prepare_sampler(int64_t vocab);

// With NIBBLE_DIAG_PHASE_TIMING=1, the last launch's time in each phase for its first `rows` rows
// (SM clock stamps of their CTAs: median and max), synchronizing the device; "" otherwise.
std::string sampler_timing(int64_t rows);

}  // namespace nibble::cuda
