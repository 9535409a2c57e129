// config.json → ModelConfig. Field names and defaults follow transformers' Qwen3MoeConfig, Qwen3Config
// (transformers/models/qwen3_moe/configuration_qwen3_moe.py) and Ernie4_5_MoeConfig
// (transformers/models/ernie4_5_moe/configuration_ernie4_5_moe.py, transformers 5.24).
#include "io/model_config.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "io/json_fields.h"

namespace nibble::io {

using json = nlohmann::json;

const std::vector<std::string>& supported_architectures() {
  static const std::vector<std::string> names = {"Qwen3MoeForCausalLM", "Qwen3ForCausalLM", "Ernie4_5_MoeForCausalLM"};
  return names;
}

bool ModelConfig::is_moe_layer(int64_t layer) const {
  if (!is_moe()) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  if (layer < moe_layer_start || (moe_layer_end >= 0 && layer > moe_layer_end)) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

namespace {

Result<ModelConfig> parse_model_config_unchecked(const std::string& json_text, const std::string& path) {
  const json root = json::parse(json_text, nullptr, false);
  if (root.is_discarded() || !root.is_object()) return Status::error(path + ": not a JSON object");
  JsonFields f(root, path);
  ModelConfig c;

  std::vector<std::string> architectures;
  f.string_list("architectures", architectures, /*required=*/true);
  if (f.ok()) {
    if (architectures.size() != 1) return Status::error(path + ": 'architectures' must name exactly one architecture");
    c.architecture = architectures[0];
    const auto& supported = supported_architectures();
    if (std::find(supported.begin(), supported.end(), c.architecture) == supported.end()) {
      std::string list;
      for (const auto& s : supported) list += (list.empty() ? "" : ", ") + s;
      return Status::error(path + ": architecture '" + c.architecture + "' is not supported (supported: " + list + ")");
    }
  }
  const bool ernie = c.architecture == "Ernie4_5_MoeForCausalLM";
  const bool moe = c.architecture == "Qwen3MoeForCausalLM" || ernie;

  f.integer("vocab_size", c.vocab_size, 1, 1 << 24, true);
  f.integer("hidden_size", c.hidden_size, 16, 1 << 20, true);
  f.integer("num_hidden_layers", c.num_hidden_layers, 1, 10000, true);
  f.integer("num_attention_heads", c.num_attention_heads, 1, 4096, true);
  c.num_key_value_heads = c.num_attention_heads;
  f.integer("num_key_value_heads", c.num_key_value_heads, 1, 4096, false);
  f.integer("intermediate_size", c.intermediate_size, 16, 1 << 22, !moe);
  f.real("rms_norm_eps", c.rms_norm_eps, 0.0, 1.0, false);
  f.integer("max_position_embeddings", c.max_position_embeddings, 1, 1 << 24, true);
  c.tie_word_embeddings = ernie;  // Ernie4_5_MoeConfig defaults to tied embeddings, Qwen3 to untied
  f.boolean("tie_word_embeddings", c.tie_word_embeddings, false);
  if (c.hidden_size > 0 && c.num_attention_heads > 0) c.head_dim = c.hidden_size / c.num_attention_heads;
  f.integer("head_dim", c.head_dim, 2, 1024, false);

  // RoPE: rope_theta at the top (transformers 4) or in rope_parameters (transformers 5).
  bool rope_theta_seen = root.contains("rope_theta");
  f.real("rope_theta", c.rope_theta, 1.0, 1e12, false);
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (!root.contains(key) || root[key].is_null()) continue;
    const json& rope = root[key];
    if (!rope.is_object()) {
      f.fail(std::string("'") + key + "' must be an object or null");
      continue;
    }
    const std::string type = rope.value("rope_type", rope.value("type", std::string("default")));
    if (type != "default") f.fail(std::string("rope type '") + type + "' is not supported yet (only default RoPE)");
    JsonFields rf(rope, path + ":" + key);
    if (rope.contains("rope_theta")) {
      rf.real("rope_theta", c.rope_theta, 1.0, 1e12, true);
      rope_theta_seen = true;
      if (!rf.ok()) f.fail(rf.error());
    }
  }
  if (!rope_theta_seen) f.fail("missing 'rope_theta'");
  bool flag = false;
  f.boolean("attention_bias", flag, false);
  if (flag) f.fail("attention_bias = true is not supported (Qwen3 has no attention bias)");
  flag = false;
  f.boolean("use_bias", flag, false);
  if (flag) f.fail("use_bias = true is not supported (ERNIE-4.5 checkpoints have no biases)");
  if (root.contains("hidden_act") && root["hidden_act"] != "silu") f.fail("hidden_act must be 'silu'");
  flag = false;
  f.boolean("use_sliding_window", flag, false);
  if (flag) f.fail("use_sliding_window = true is not supported yet");

  if (ernie) {
    // Ernie4_5_MoeConfig: moe_num_experts / moe_k (attribute_map num_experts / num_experts_per_tok),
    // MoE layers where (l + 1) % moe_layer_interval == 0 and start ≤ l ≤ end (end -1: the last).
    c.rope_style = RopeStyle::INTERLEAVED, c.qk_norm = false, c.router_fp32 = true, c.router_score_bias = true;
    c.rms_norm_eps = 1e-5, c.moe_layer_start = 1, c.moe_norm_min = 1e-12, c.moe_num_shared_experts = 2;
    f.real("rms_norm_eps", c.rms_norm_eps, 0.0, 1.0, false);
    f.integer(root.contains("moe_num_experts") ? "moe_num_experts" : "num_experts", c.num_experts, 1, 4096, true);
    f.integer(root.contains("moe_k") ? "moe_k" : "num_experts_per_tok", c.num_experts_per_tok, 1, 4096, true);
    f.integer("moe_intermediate_size", c.moe_intermediate_size, 16, 1 << 22, true);
    f.integer("moe_num_shared_experts", c.moe_num_shared_experts, 0, 64, false);
    f.integer("moe_layer_start_index", c.moe_layer_start, 0, 10000, false);
    f.integer("moe_layer_end_index", c.moe_layer_end, -1, 10000, false);
    f.integer("moe_layer_interval", c.decoder_sparse_step, 1, 10000, false);
    f.real("moe_norm_min", c.moe_norm_min, 0.0, 1.0, false);
    if (c.num_experts_per_tok > c.num_experts) f.fail("moe_k exceeds moe_num_experts");
  } else if (moe) {
    // transformers 5 serializes num_experts as num_local_experts.
    f.integer(root.contains("num_local_experts") ? "num_local_experts" : "num_experts", c.num_experts, 1, 4096, true);
    f.integer("num_experts_per_tok", c.num_experts_per_tok, 1, 4096, true);
    f.integer("moe_intermediate_size", c.moe_intermediate_size, 16, 1 << 22, true);
    f.boolean("norm_topk_prob", c.norm_topk_prob, false);
    f.integer("decoder_sparse_step", c.decoder_sparse_step, 1, 10000, false);
    f.integer_list("mlp_only_layers", c.mlp_only_layers, false);
    if (c.num_experts_per_tok > c.num_experts) f.fail("num_experts_per_tok exceeds num_experts");
  }
  if (root.contains("eos_token_id") && !root["eos_token_id"].is_null()) {
    if (root["eos_token_id"].is_number_integer())
      c.eos_token_ids = {root["eos_token_id"].get<int64_t>()};
    else
      f.integer_list("eos_token_id", c.eos_token_ids, false);
  }

  if (c.num_attention_heads > 0 && c.num_key_value_heads > 0 && c.num_attention_heads % c.num_key_value_heads != 0)
    f.fail("num_attention_heads must be a multiple of num_key_value_heads");
  if (c.head_dim % 2 != 0) f.fail("head_dim must be even (RoPE rotates pairs)");
  for (int64_t l : c.mlp_only_layers)
    if (l < 0 || l >= c.num_hidden_layers)
      f.fail("mlp_only_layers lists layer " + std::to_string(l) + ", out of range");
  bool any_dense = !moe;
  for (int64_t l = 0; moe && l < c.num_hidden_layers; ++l) any_dense |= !c.is_moe_layer(l);
  if (any_dense && c.intermediate_size <= 0) f.fail("dense MLP layers need 'intermediate_size'");
  if (!f.ok()) return Status::error(f.error());
  return c;
}

}  // namespace

Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& path) {
  try {  // a field of an unexpected JSON type inside nested objects throws in nlohmann's accessors
    return parse_model_config_unchecked(json_text, path);
  } catch (const nlohmann::json::exception& e) {
    return Status::error(path + ": " + e.what());
  }
}

}  // namespace nibble::io
