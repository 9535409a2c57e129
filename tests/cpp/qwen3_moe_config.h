// A Qwen3-MoE config.json for tests that need shapes but no weights: Qwen3-30B-A3B's, two layers (the
// second a dense MLP), with `changes` merged in (JSON merge patch: null removes a key).
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "io/model_config.h"

namespace nibble::test {

inline io::ModelConfig qwen3_moe_config(const nlohmann::json& changes = nlohmann::json::object()) {
  nlohmann::json c = {{"architectures", {"Qwen3MoeForCausalLM"}},
                      {"vocab_size", 151936},
                      {"hidden_size", 2048},
                      {"intermediate_size", 6144},
                      {"num_hidden_layers", 2},
                      {"num_attention_heads", 32},
                      {"num_key_value_heads", 4},
                      {"head_dim", 128},
                      {"rope_theta", 1e6},
                      {"max_position_embeddings", 40960},
                      {"num_experts", 128},
                      {"num_experts_per_tok", 8},
                      {"moe_intermediate_size", 768},
                      {"mlp_only_layers", {1}}};
  c.merge_patch(changes);
  auto r = io::parse_model_config(c.dump(), "config.json");
  EXPECT_TRUE(r.is_ok()) << r.status().message();
  return *r;
}

}  // namespace nibble::test
