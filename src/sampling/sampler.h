// Token sampling on the CPU with vLLM's order of processing: min_tokens mask, penalties
// (repetition on prompt+output, presence/frequency on output), then greedy, or temperature →
// min_p → top_k → top_p → a seeded draw. Logprobs are of the raw model distribution (vLLM's
// default "raw_logprobs"), so they do not depend on the sampling settings.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "sampling/params.h"

namespace nibble::sampling {

// The highest logit's index; the lowest index among equal maxima (as torch.argmax).
int32_t argmax(std::span<const float> logits);

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct SampledToken {
  int32_t token = 0;
  float logprob = 0.0f;             // of `token`, when params.logprobs >= 0
  std::vector<TokenLogprob> top;    // params.logprobs most likely tokens, most likely first
};

// What the penalties and min_tokens need to know about the sequence.
struct SequenceContext {
  std::span<const int32_t> prompt;
  std::span<const int32_t> output;
  std::span<const int32_t> masked;  // tokens that may not be drawn now (EOS while < min_tokens)
};

SampledToken sample_next(std::span<const float> logits, const SamplingParams& params, const SequenceContext& context,
                         std::mt19937_64& rng);

}  // namespace nibble::sampling
