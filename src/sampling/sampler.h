// Token sampling on the CPU with vLLM's order of processing: min_tokens mask, logit_bias, penalties
// (repetition on prompt+output, presence/frequency on output), then greedy, or temperature →
// min_p → top_k → top_p → a seeded draw. Logprobs are of the raw model distribution (vLLM's
// default "raw_logprobs"), so they do not depend on the sampling settings.
// The draw is an exponential race keyed by a counter-based RNG: token = argmax over the kept
// candidates of p_t / E_t, E_t = -log(u_t), u_t = Philox(seed; position, t). That picks t with
// probability p_t / Σp (the Gumbel-max trick), needs no sorted cumulative sum, and is a pure function
// of (logits, seed, position): the GPU sampler computes the same race and draws the same token.
#pragma once

#include <cstdint>
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
  float logprob = 0.0f;           // of `token`, when params.logprobs >= 0
  std::vector<TokenLogprob> top;  // params.logprobs most likely tokens, most likely first
};

// What the penalties and min_tokens need to know about the sequence.
struct SequenceContext {
  std::span<const int32_t> prompt;
  std::span<const int32_t> output;
  std::span<const int32_t> masked;  // tokens that may not be drawn now (EOS while < min_tokens)
  // Structured output: bit t % 32 of word t / 32 set = token t may be drawn; empty: every token.
  std::span<const uint32_t> allowed;
};

// Which random numbers a draw uses: the sequence's seed and the position of the token being drawn.
struct DrawKey {
  uint64_t seed = 0;
  uint64_t position = 0;
};

// The race's noise for candidate `token`: E = -log(u), u in (0, 1].
double race_noise(const DrawKey& key, int32_t token);

// A given token's raw-distribution logprob and the k_top most likely tokens (prompt logprobs: the
// token is the prompt's next one, nothing is drawn).
SampledToken score_token(std::span<const float> logits, int32_t token, int32_t k_top);

SampledToken sample_next(std::span<const float> logits, const SamplingParams& params, const SequenceContext& context,
                         const DrawKey& key);

}  // namespace nibble::sampling
