// ModelConfig: the plain description of a model, filled once from a Hugging Face config.json and
// validated field by field. Kernels and models read this struct, never JSON.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace nibble::io {

struct ModelConfig {
  std::string architecture;        // HF architectures[0]: Qwen3MoeForCausalLM or Qwen3ForCausalLM
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;         // H
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0; // query heads
  int64_t num_key_value_heads = 0; // KV heads (GQA); divides num_attention_heads
  int64_t head_dim = 0;            // config head_dim, else hidden_size / num_attention_heads
  int64_t intermediate_size = 0;   // dense MLP width (Qwen3 dense, MoE-model dense layers)
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;     // neox-style RoPE base; no rope scaling supported yet
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  // Mixture of experts (num_experts == 0 for dense models).
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;  // top-k
  int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = true;       // renormalize the top-k router weights to sum to 1
  int64_t decoder_sparse_step = 1;  // layer l is MoE when (l + 1) % step == 0 ...
  std::vector<int64_t> mlp_only_layers;  // ... and l is not listed here
  std::vector<int64_t> eos_token_ids;    // from config.json (generation_config may add more)

  bool is_moe() const { return num_experts > 0; }
  bool is_moe_layer(int64_t layer) const;
};

// The architectures nibble can run, for error messages and the model registry.
const std::vector<std::string>& supported_architectures();

// Parses config.json text; `path` labels errors. Unknown architectures and unsupported features
// (rope scaling, sliding window, attention bias) are errors that say so.
Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& path);

}  // namespace nibble::io
