// ModelConfig: the plain description of a model, filled once from a Hugging Face config.json and
// validated field by field. Kernels and models read this struct, never JSON.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace nibble::io {

// How RoPE pairs a head's dimensions: i with i + head_dim/2 (transformers' rotate_half on halves:
// Qwen3), or 2i with 2i + 1 (rotate_half on the even/odd interleave: ERNIE-4.5).
enum class RopeStyle { NEOX, INTERLEAVED };

// RoPE scaling as transformers' modeling_rope_utils.py computes it (rope_scaling / rope_parameters):
// linear divides every frequency by `factor`; YaRN blends interpolated and original frequencies
// over a ramp between beta_fast and beta_slow rotations of the pretraining context, and multiplies
// cos and sin by attention_factor. (models/rope.h turns this into the frequency table.)
enum class RopeScalingType { NONE, LINEAR, YARN };
struct RopeScaling {
  RopeScalingType type = RopeScalingType::NONE;
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;  // YaRN: the pretraining context
  double beta_fast = 32.0, beta_slow = 1.0;      // YaRN: the ramp's ends, in rotations
  double attention_factor = 1.0;                 // YaRN: cos and sin multiply by it
  bool truncate = true;                          // YaRN: the ramp's ends rounded outwards
};

struct ModelConfig {
  std::string architecture;  // HF architectures[0]: Qwen3MoeForCausalLM, Qwen3ForCausalLM, Ernie4_5_MoeForCausalLM
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;  // H
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;  // query heads
  int64_t num_key_value_heads = 0;  // KV heads (GQA); divides num_attention_heads
  int64_t head_dim = 0;             // config head_dim, else hidden_size / num_attention_heads
  int64_t intermediate_size = 0;    // dense MLP width (Qwen3 dense, MoE-model dense layers)
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;  // RoPE base
  RopeStyle rope_style = RopeStyle::NEOX;
  RopeScaling rope_scaling;
  bool qk_norm = true;  // per-head RMSNorm of q and k before RoPE (Qwen3; not ERNIE-4.5)
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  // Mixture of experts (num_experts == 0 for dense models).
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;  // top-k
  int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = true;       // renormalize the top-k router weights to sum to 1
  int64_t decoder_sparse_step = 1;  // layer l is MoE when (l + 1) % step == 0 (ERNIE: moe_layer_interval) ...
  int64_t moe_layer_start = 0;      // ... and moe_layer_start ≤ l ≤ moe_layer_end (ERNIE; Qwen3: every layer) ...
  int64_t moe_layer_end = -1;       //     (-1: the last layer)
  std::vector<int64_t> mlp_only_layers;  // ... and l is not listed here
  // ERNIE-4.5: shared experts (one SwiGLU MLP of width moe_intermediate_size · n) beside the routed
  // ones; the router weight in fp32 with a per-expert score-correction bias that picks the top-k
  // (the unbiased probabilities weigh them), renormalized by max(sum, moe_norm_min).
  int64_t moe_num_shared_experts = 0;
  bool router_fp32 = false;
  bool router_score_bias = false;
  double moe_norm_min = 0.0;
  std::vector<int64_t> eos_token_ids;  // from config.json (generation_config may add more)

  bool is_moe() const { return num_experts > 0; }
  // The longest sequence the model takes: max_position_embeddings, or the scaled context when longer
  // (as vLLM derives it: YaRN's original_max_position_embeddings · factor, linear's
  // max_position_embeddings · factor).
  int64_t context_length() const;
  bool is_moe_layer(int64_t layer) const;
};

// The architectures nibble can run, for error messages and the model registry.
const std::vector<std::string>& supported_architectures();

// What a server or tool changes in config.json before reading it (each JSON text, "" for none):
// `json` is merged into the file's object key by key, recursively into objects, a null removing the
// key (RFC 7386; vLLM's --hf-overrides); `rope_scaling` is merged into rope_scaling, and into
// rope_parameters where the file has that (transformers 5 keeps rope_theta there).
struct ConfigOverrides {
  std::string json, rope_scaling;
};

// Parses config.json text; `path` labels errors. Unknown architectures and unsupported features
// (other RoPE scalings, sliding window, attention bias) are errors that say so.
Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& path,
                                       const ConfigOverrides& overrides = {});

}  // namespace nibble::io
