// SamplingParams validation.
#include "sampling/params.h"

#include <cmath>
#include <string>

namespace nibble::sampling {

Status SamplingParams::validate() const {
  auto bad = [](const char* field, const std::string& why) { return Status::error(std::string(field) + " " + why); };
  if (!std::isfinite(temperature) || temperature < 0.0f) return bad("temperature", "must be a number >= 0");
  if (top_k < -1) return bad("top_k", "must be -1 (off), 0 (off) or a positive count");
  if (!(top_p > 0.0f && top_p <= 1.0f)) return bad("top_p", "must be in (0, 1]");
  if (!(min_p >= 0.0f && min_p <= 1.0f)) return bad("min_p", "must be in [0, 1]");
  if (!(repetition_penalty > 0.0f && repetition_penalty <= 1e4f)) return bad("repetition_penalty", "must be > 0");
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) return bad("presence_penalty", "must be in [-2, 2]");
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) return bad("frequency_penalty", "must be in [-2, 2]");
  if (logprobs < -1 || logprobs > 20) return bad("logprobs", "must be at most 20");
  for (size_t i = 0; i < logit_bias.size(); ++i) {
    const auto [token, bias] = logit_bias[i];
    if (token < 0 || (i > 0 && token <= logit_bias[i - 1].first))
      return bad("logit_bias", "must name distinct token ids >= 0, in ascending order");
    if (!(bias >= -100.0f && bias <= 100.0f)) return bad("logit_bias", "values must be in [-100, 100]");
  }
  return Status::ok();
}

}  // namespace nibble::sampling
