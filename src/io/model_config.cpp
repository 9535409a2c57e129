// config.json → ModelConfig. Field names and defaults follow transformers' Qwen3MoeConfig, Qwen3Config
// (transformers/models/qwen3_moe/configuration_qwen3_moe.py) and Ernie4_5_MoeConfig
// (transformers/models/ernie4_5_moe/configuration_ernie4_5_moe.py, transformers 5.24).
#include "io/model_config.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "io/json_fields.h"

namespace nibble::io {

using json = nlohmann::json;

const std::vector<std::string>& supported_architectures() {
  static const std::vector<std::string> names = {"Qwen3MoeForCausalLM", "Qwen3ForCausalLM", "Ernie4_5_MoeForCausalLM"};
  return names;
}

int64_t ModelConfig::context_length() const {
  const RopeScaling& s = rope_scaling;
  if (s.type == RopeScalingType::NONE) return max_position_embeddings;
  const int64_t base = s.type == RopeScalingType::YARN ? s.original_max_position_embeddings : max_position_embeddings;
  return std::max(max_position_embeddings, static_cast<int64_t>(static_cast<double>(base) * s.factor));
}

bool ModelConfig::is_moe_layer(int64_t layer) const {
  if (!is_moe()) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  if (layer < moe_layer_start || (moe_layer_end >= 0 && layer > moe_layer_end)) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

namespace {

// transformers' get_mscale: YaRN's attention factor for a scale.
double yarn_mscale(double scale, double mscale) { return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

// A rope_scaling / rope_parameters object's type and fields into c.rope_scaling, as transformers 5.24's
// _compute_linear_scaling_rope_parameters and _compute_yarn_parameters (with standardize_rope_params'
// defaults) read them.
void read_rope_scaling(const json& root, const json& rope, JsonFields& rf, ModelConfig& c) {
  const char* type_key = rope.contains("rope_type") ? "rope_type" : "type";  // "type": the older spelling
  const json type_field = rope.value(type_key, json("default"));
  if (!type_field.is_string()) return rf.fail(std::string("'") + type_key + "' must be a string, e.g. \"yarn\"");
  const std::string type = type_field.get<std::string>();
  if (type == "default") return;  // (rope_parameters' plain rope_theta leaves rope_scaling's scaling)
  RopeScaling& s = c.rope_scaling;
  s = RopeScaling{};
  if (type == "linear") {
    s.type = RopeScalingType::LINEAR;
    rf.real("factor", s.factor, 1e-3, 1e6, true);
  } else if (type == "yarn") {
    s.type = RopeScalingType::YARN;
    s.original_max_position_embeddings = c.max_position_embeddings;
    rf.integer("original_max_position_embeddings", s.original_max_position_embeddings, 1, 1 << 24, false);
    const json& top = root.value("original_max_position_embeddings", json());  // Phi-3's place, which wins
    if (top.is_number_integer() && top.get<int64_t>() > 0) s.original_max_position_embeddings = top.get<int64_t>();
    s.factor = 0.0;
    rf.real("factor", s.factor, 1e-3, 1e6, false);
    if (s.factor == 0.0 && s.original_max_position_embeddings > 0)
      s.factor =
          static_cast<double>(c.max_position_embeddings) / static_cast<double>(s.original_max_position_embeddings);
    // beta_fast / beta_slow / mscale: transformers reads them with `or`, so 0 means the default.
    double mscale = 0.0, mscale_all_dim = 0.0, attention_factor = -1.0;
    rf.real("beta_fast", s.beta_fast, 0.0, 1e6, false);
    rf.real("beta_slow", s.beta_slow, 0.0, 1e6, false);
    if (s.beta_fast == 0.0) s.beta_fast = 32.0;
    if (s.beta_slow == 0.0) s.beta_slow = 1.0;
    rf.real("mscale", mscale, 0.0, 1e6, false);
    rf.real("mscale_all_dim", mscale_all_dim, 0.0, 1e6, false);
    rf.real("attention_factor", attention_factor, 0.0, 1e6, false);
    rf.boolean("truncate", s.truncate, false);
    if (attention_factor >= 0.0)
      s.attention_factor = attention_factor;
    else if (mscale != 0.0 && mscale_all_dim != 0.0)
      s.attention_factor = yarn_mscale(s.factor, mscale) / yarn_mscale(s.factor, mscale_all_dim);
    else
      s.attention_factor = yarn_mscale(s.factor, 1.0);
  } else if (type == "dynamic") {
    rf.fail(
        "rope type 'dynamic' is not supported: transformers rescales it by the batch's current length, which "
        "a serving batch does not have (Qwen's long-context models use 'yarn')");
  } else {
    rf.fail("rope type '" + type + "' is not supported (nibble runs 'default', 'linear' and 'yarn' RoPE)");
  }
}

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

  // RoPE: rope_theta at the top (transformers 4) or in rope_parameters (transformers 5), with the
  // scaling's fields beside it (either key).
  bool rope_theta_seen = root.contains("rope_theta");
  f.real("rope_theta", c.rope_theta, 1.0, 1e12, false);
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (!root.contains(key) || root[key].is_null()) continue;
    const json& rope = root[key];
    if (!rope.is_object()) {
      f.fail(std::string("'") + key + "' must be an object or null");
      continue;
    }
    JsonFields rf(rope, path + ":" + key);
    if (rope.contains("rope_theta")) {
      rf.real("rope_theta", c.rope_theta, 1.0, 1e12, true);
      rope_theta_seen = true;
    }
    read_rope_scaling(root, rope, rf, c);
    if (!rf.ok()) f.fail(rf.error());
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

Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& path,
                                       const ConfigOverrides& overrides) {
  try {  // a field of an unexpected JSON type inside nested objects throws in nlohmann's accessors
    if (overrides.json.empty() && overrides.rope_scaling.empty()) return parse_model_config_unchecked(json_text, path);
    json root = json::parse(json_text, nullptr, false);
    if (root.is_discarded() || !root.is_object()) return Status::error(path + ": not a JSON object");
    if (!overrides.json.empty()) {
      const json patch = json::parse(overrides.json, nullptr, false);
      if (patch.is_discarded() || !patch.is_object())
        return Status::error("the config overrides (--hf-overrides) are not a JSON object: " + overrides.json);
      root.merge_patch(patch);
    }
    if (!overrides.rope_scaling.empty()) {
      json rope = json::parse(overrides.rope_scaling, nullptr, false);
      if (rope.is_discarded() || !rope.is_object())
        return Status::error("--rope-scaling is not a JSON object: " + overrides.rope_scaling);
      if (rope.contains("type") && !rope.contains("rope_type")) rope["rope_type"] = rope["type"];  // older spelling
      if (!root.contains("rope_scaling") || !root["rope_scaling"].is_object()) root["rope_scaling"] = json::object();
      root["rope_scaling"].merge_patch(rope);
      if (root.contains("rope_parameters") && root["rope_parameters"].is_object())
        root["rope_parameters"].merge_patch(rope);
    }
    return parse_model_config_unchecked(root.dump(), path + " (with overrides)");
  } catch (const nlohmann::json::exception& e) {
    return Status::error(path + ": " + e.what());
  }
}

}  // namespace nibble::io
