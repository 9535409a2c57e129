// Per-request sampling parameters with OpenAI/vLLM semantics, and their validation (the error
// names the field, so the server can answer 400 with it).
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "core/status.h"

namespace nibble::sampling {

struct SamplingParams {
  float temperature = 1.0f;         // 0: greedy
  int32_t top_k = 0;                // 0 or -1: off
  float top_p = 1.0f;               // 1: off
  float min_p = 0.0f;               // 0: off; keeps tokens with p >= min_p * max p
  float repetition_penalty = 1.0f;  // prompt and output tokens: l > 0 ? l / r : l * r
  float presence_penalty = 0.0f;    // output tokens: l -= presence once seen
  float frequency_penalty = 0.0f;   // output tokens: l -= frequency * count
  std::optional<uint64_t> seed;     // reproducible draws when set
  int32_t logprobs = -1;            // -1: none; 0: the sampled token's; k: also the top k
  // OpenAI's logit_bias: (token, bias in [-100, 100]) pairs, distinct tokens in ascending order,
  // added to the logits after the min_tokens mask and before the penalties (vLLM's order).
  std::vector<std::pair<int32_t, float>> logit_bias;

  bool greedy() const { return temperature < 1e-5f; }  // vLLM's threshold for greedy
  bool has_penalties() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }
  // Ranges as vLLM enforces them (vllm/sampling_params.py _verify_args); the message names the field.
  Status validate() const;
};

}  // namespace nibble::sampling
