// generation_config.json: the model's default sampling settings and end-of-sequence ids, which
// the server uses for fields a request leaves out (as vLLM's --generation-config auto does).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace nibble::io {

struct GenerationConfig {
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<int64_t> top_k, max_new_tokens;
  std::vector<int64_t> eos_token_ids;
};

// A folder without generation_config.json gives an empty config; a malformed one is an error.
Result<GenerationConfig> load_generation_config(const std::string& model_dir);

}  // namespace nibble::io
