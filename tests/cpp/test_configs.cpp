// config.json → ModelConfig, ModelOpt quant configs (both forms), and exclusion pattern matching.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/model_config.h"
#include "io/quant_config.h"

using namespace nibble::io;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

// Qwen/Qwen3-30B-A3B's config.json (the fields nibble reads).
json qwen3_moe_config() {
  return {{"architectures", {"Qwen3MoeForCausalLM"}},
          {"vocab_size", 151936},
          {"hidden_size", 2048},
          {"intermediate_size", 6144},
          {"num_hidden_layers", 48},
          {"num_attention_heads", 32},
          {"num_key_value_heads", 4},
          {"head_dim", 128},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 1000000.0},
          {"rope_scaling", nullptr},
          {"max_position_embeddings", 40960},
          {"tie_word_embeddings", false},
          {"num_experts", 128},
          {"num_experts_per_tok", 8},
          {"moe_intermediate_size", 768},
          {"norm_topk_prob", true},
          {"decoder_sparse_step", 1},
          {"mlp_only_layers", json::array()},
          {"eos_token_id", 151645},
          {"attention_bias", false},
          {"use_sliding_window", false}};
}

std::string error_of(const json& config) {
  auto r = parse_model_config(config.dump(), "config.json");
  return r.is_ok() ? "" : r.status().message();
}

}  // namespace

TEST(ModelConfig, Qwen3MoeParses) {
  auto r = parse_model_config(qwen3_moe_config().dump(), "config.json");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->num_experts, 128);
  EXPECT_EQ(r->head_dim, 128);
  EXPECT_EQ(r->rope_theta, 1e6);
  EXPECT_EQ(r->eos_token_ids, std::vector<int64_t>{151645});
  EXPECT_TRUE(r->is_moe_layer(0));
  EXPECT_TRUE(r->is_moe_layer(47));
}

// baidu/ERNIE-4.5-21B-A3B-PT's config.json (its own spelling: rope_theta at the top, moe_* fields,
// no head_dim, no tie_word_embeddings: Ernie4_5_MoeConfig's default, tied).
json ernie_config() {
  return {{"architectures", {"Ernie4_5_MoeForCausalLM"}},
          {"vocab_size", 103424},
          {"hidden_size", 2560},
          {"intermediate_size", 12288},
          {"num_hidden_layers", 28},
          {"num_attention_heads", 20},
          {"num_key_value_heads", 4},
          {"max_position_embeddings", 131072},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 500000},
          {"use_bias", false},
          {"hidden_act", "silu"},
          {"moe_num_experts", 64},
          {"moe_k", 6},
          {"moe_intermediate_size", 1536},
          {"moe_num_shared_experts", 2},
          {"moe_layer_start_index", 1},
          {"moe_layer_interval", 1},
          {"eos_token_id", 2}};
}

TEST(ModelConfig, Ernie45MoeParses) {
  auto r = parse_model_config(ernie_config().dump(), "config.json");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->num_experts, 64);
  EXPECT_EQ(r->num_experts_per_tok, 6);
  EXPECT_EQ(r->head_dim, 128);
  EXPECT_EQ(r->moe_num_shared_experts, 2);
  EXPECT_TRUE(r->tie_word_embeddings);
  EXPECT_FALSE(r->qk_norm);
  EXPECT_EQ(r->rope_style, RopeStyle::INTERLEAVED);
  EXPECT_TRUE(r->router_fp32 && r->router_score_bias);
  EXPECT_EQ(r->moe_norm_min, 1e-12);
  EXPECT_FALSE(r->is_moe_layer(0));  // moe_layer_start_index 1: a dense first layer
  EXPECT_TRUE(r->is_moe_layer(1));
  EXPECT_TRUE(r->is_moe_layer(27));  // moe_layer_end_index -1: through the last layer
  json c = ernie_config();
  c["moe_layer_end_index"] = 20, c["moe_layer_interval"] = 2;
  r = parse_model_config(c.dump(), "config.json");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_TRUE(r->is_moe_layer(1));  // (1 + 1) % 2 == 0
  EXPECT_FALSE(r->is_moe_layer(2));
  EXPECT_FALSE(r->is_moe_layer(21));  // past the end index
  c = ernie_config();
  c["use_bias"] = true;
  EXPECT_NE(error_of(c).find("use_bias"), std::string::npos) << error_of(c);
}

TEST(ModelConfig, Transformers5Spelling) {
  json c = qwen3_moe_config();
  c.erase("num_experts");
  c.erase("rope_theta");
  c["num_local_experts"] = 64;
  c["rope_parameters"] = {{"rope_theta", 5e5}, {"rope_type", "default"}};
  auto r = parse_model_config(c.dump(), "config.json");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->num_experts, 64);
  EXPECT_EQ(r->rope_theta, 5e5);
}

TEST(ModelConfig, DenseLayersAndHeadDimDefault) {
  json c = qwen3_moe_config();
  c["mlp_only_layers"] = {0, 5};
  c["decoder_sparse_step"] = 2;
  c.erase("head_dim");
  auto r = parse_model_config(c.dump(), "config.json");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->head_dim, 64);  // hidden / heads
  EXPECT_FALSE(r->is_moe_layer(0));
  EXPECT_TRUE(r->is_moe_layer(1));
  EXPECT_FALSE(r->is_moe_layer(2));
  EXPECT_FALSE(r->is_moe_layer(5));
}

TEST(ModelConfig, Qwen3DenseParses) {
  json c = qwen3_moe_config();
  c["architectures"] = {"Qwen3ForCausalLM"};
  for (const char* k : {"num_experts", "num_experts_per_tok", "moe_intermediate_size"}) c.erase(k);
  auto r = parse_model_config(c.dump(), "config.json");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_FALSE(r->is_moe());
  EXPECT_FALSE(r->is_moe_layer(0));
}

// Qwen's model cards: YaRN with factor 4 over a 32,768-token pretraining context serves 131,072.
TEST(ModelConfig, RopeScalingAndTheContextItGives) {
  json c = qwen3_moe_config();
  c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  auto r = parse_model_config(c.dump(), "config.json");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->rope_scaling.type, RopeScalingType::YARN);
  EXPECT_EQ(r->context_length(), 131072);
  EXPECT_NEAR(r->rope_scaling.attention_factor, 0.1 * std::log(4.0) + 1.0, 1e-12);
  EXPECT_EQ(r->rope_scaling.beta_fast, 32.0);
  EXPECT_EQ(r->rope_scaling.beta_slow, 1.0);
  // mscale / mscale_all_dim (DeepSeek's spelling) and an explicit attention_factor.
  c["rope_scaling"]["mscale"] = 0.707, c["rope_scaling"]["mscale_all_dim"] = 1.0;
  r = parse_model_config(c.dump(), "config.json");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_NEAR(r->rope_scaling.attention_factor, (0.0707 * std::log(4.0) + 1.0) / (0.1 * std::log(4.0) + 1.0), 1e-12);
  c["rope_scaling"]["attention_factor"] = 1.5;
  EXPECT_EQ(parse_model_config(c.dump(), "config.json")->rope_scaling.attention_factor, 1.5);
  // No factor: max_position_embeddings / original_max_position_embeddings (transformers).
  c["rope_scaling"] = {{"rope_type", "yarn"}, {"original_max_position_embeddings", 10240}};
  EXPECT_EQ(parse_model_config(c.dump(), "config.json")->rope_scaling.factor, 4.0);
  // Linear: max_position_embeddings · factor.
  c["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  r = parse_model_config(c.dump(), "config.json");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->rope_scaling.type, RopeScalingType::LINEAR);
  EXPECT_EQ(r->context_length(), 81920);
  // Unscaled: max_position_embeddings.
  EXPECT_EQ(parse_model_config(qwen3_moe_config().dump(), "config.json")->context_length(), 40960);
}

// --hf-overrides merges into the file; --rope-scaling into rope_scaling, and into transformers 5's
// rope_parameters (keeping its rope_theta), the older "type" spelling included.
TEST(ModelConfig, OverridesMergeIntoTheFile) {
  json c = qwen3_moe_config();
  c.erase("rope_theta"), c.erase("rope_scaling");
  c["rope_parameters"] = {{"rope_theta", 5e5}, {"rope_type", "default"}};
  ConfigOverrides o;
  o.json = R"({"max_position_embeddings": 8192, "rope_parameters": {"rope_theta": 2e5}})";
  o.rope_scaling = R"({"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8192})";
  auto r = parse_model_config(c.dump(), "config.json", o);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->max_position_embeddings, 8192);
  EXPECT_EQ(r->rope_theta, 2e5);
  EXPECT_EQ(r->rope_scaling.type, RopeScalingType::YARN);
  EXPECT_EQ(r->context_length(), 16384);
  o.json = "[1]";
  EXPECT_NE(parse_model_config(c.dump(), "config.json", o).status().message().find("--hf-overrides"),
            std::string::npos);
  o.json = "", o.rope_scaling = "yarn";
  EXPECT_NE(parse_model_config(c.dump(), "config.json", o).status().message().find("--rope-scaling is not a JSON"),
            std::string::npos);
}

TEST(ModelConfig, ErrorsNameTheProblem) {
  json c = qwen3_moe_config();
  c["architectures"] = {"LlamaForCausalLM"};
  EXPECT_NE(error_of(c).find("'LlamaForCausalLM' is not supported (supported: Qwen3MoeForCausalLM, Qwen3ForCausalLM, "
                             "Ernie4_5_MoeForCausalLM)"),
            std::string::npos)
      << error_of(c);

  c = qwen3_moe_config();
  c.erase("vocab_size");
  c["hidden_size"] = "2048";
  c["num_key_value_heads"] = 5;
  const std::string e = error_of(c);
  EXPECT_NE(e.find("missing 'vocab_size'"), std::string::npos) << e;
  EXPECT_NE(e.find("'hidden_size' must be an integer"), std::string::npos) << e;
  EXPECT_NE(e.find("multiple of num_key_value_heads"), std::string::npos) << e;

  c = qwen3_moe_config();
  c["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 4.0}};
  EXPECT_NE(error_of(c).find("rope type 'dynamic' is not supported"), std::string::npos) << error_of(c);
  c["rope_scaling"] = {{"rope_type", "longrope"}};
  EXPECT_NE(error_of(c).find("rope type 'longrope' is not supported (nibble runs 'default', 'linear' and 'yarn'"),
            std::string::npos)
      << error_of(c);
  c["rope_scaling"] = {{"rope_type", "linear"}};
  EXPECT_NE(error_of(c).find("missing 'factor'"), std::string::npos) << error_of(c);
  c["rope_scaling"] = {{"type", 4}};
  EXPECT_NE(error_of(c).find("rope_scaling: 'type' must be a string"), std::string::npos) << error_of(c);
  c = qwen3_moe_config();
  c["num_experts_per_tok"] = 200;
  EXPECT_NE(error_of(c).find("exceeds num_experts"), std::string::npos);
  EXPECT_NE(parse_model_config("{not json", "c.json").status().message().find("c.json: not a JSON object"),
            std::string::npos);
}

TEST(ExcludePatterns, FnmatchWithModelOptPrefixRule) {
  const struct {
    const char* pattern;
    const char* module;
    bool match;
  } cases[] = {
      {"lm_head", "lm_head", true},
      {"lm_head", "lm_head.x", false},
      {"lm_head*", "lm_head", true},
      {"lm_head*", "lm_head.weight_quantizer", true},
      {"lm_head*", "lm_head_2", false},  // prefix rule: not a sibling
      {"model.layers.0.self_attn*", "model.layers.0.self_attn.q_proj", true},
      {"model.layers.0.self_attn*", "model.layers.0.self_attn_x", false},
      {"*mlp.gate", "model.layers.7.mlp.gate", true},
      {"*mlp.gate*", "model.layers.7.mlp.gate_proj", false},
      {"*mlp.gate.*", "model.layers.7.mlp.gate", false},
      {"*.mlp.experts.*", "model.layers.7.mlp.experts.3.up_proj", true},
      {"model.layers.[0-3].mlp.gate", "model.layers.2.mlp.gate", true},
      {"model.layers.[!0-3].mlp.gate", "model.layers.2.mlp.gate", false},
      {"model.layers.?.mlp.gate", "model.layers.12.mlp.gate", false},
      {"*", "anything.at.all", true},
  };
  for (const auto& c : cases)
    EXPECT_EQ(module_pattern_matches(c.pattern, c.module), c.match) << c.pattern << " vs " << c.module;
}

namespace {

fs::path folder_with(const std::string& name, const json& config, const json* hf_quant) {
  fs::path dir = fs::temp_directory_path() / ("nibble_qc_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << config.dump();
  if (hf_quant) std::ofstream(dir / "hf_quant_config.json") << hf_quant->dump();
  return dir;
}

nibble::Result<QuantConfig> load(const fs::path& dir) {
  std::ifstream in(dir / "config.json");
  std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  return load_quant_config(dir.string(), text);
}

}  // namespace

TEST(QuantConfig, HfQuantConfigFile) {
  const json hf = {{"producer", {{"name", "modelopt"}, {"version", "0.29.0"}}},
                   {"quantization",
                    {{"quant_algo", "NVFP4"},
                     {"kv_cache_quant_algo", nullptr},
                     {"group_size", 16},
                     {"exclude_modules", {"lm_head", "model.layers.0.mlp.gate"}}}}};
  auto q = load(folder_with("hf", qwen3_moe_config(), &hf));
  ASSERT_TRUE(q.is_ok()) << q.status().message();
  EXPECT_TRUE(q->nvfp4);
  EXPECT_EQ(q->producer, "modelopt 0.29.0");
  EXPECT_TRUE(q->is_excluded("lm_head"));
  EXPECT_TRUE(q->is_excluded("model.layers.0.mlp.gate"));
  EXPECT_FALSE(q->is_excluded("model.layers.1.mlp.gate"));
  EXPECT_TRUE(q->is_quantized("model.layers.0.mlp.experts.0.up_proj"));
}

TEST(QuantConfig, EmbeddedQuantizationConfig) {
  json c = qwen3_moe_config();
  c["quantization_config"] = {{"quant_method", "modelopt"},
                              {"quant_algo", "NVFP4"},
                              {"ignore", {"lm_head", "*mlp.gate"}},
                              {"config_groups", {{"group_0", {{"weights", {{"num_bits", 4}, {"group_size", 16}}}}}}}};
  auto q = load(folder_with("embedded", c, nullptr));
  ASSERT_TRUE(q.is_ok()) << q.status().message();
  EXPECT_TRUE(q->nvfp4);
  EXPECT_TRUE(q->is_excluded("model.layers.9.mlp.gate"));
}

TEST(QuantConfig, UnquantizedAndUnsupported) {
  auto plain = load(folder_with("plain", qwen3_moe_config(), nullptr));
  ASSERT_TRUE(plain.is_ok());
  EXPECT_FALSE(plain->nvfp4);
  EXPECT_FALSE(plain->is_quantized("lm_head"));

  // ModelOpt's FP8 KV-cache calibration is read (its scales serve --kv-cache-dtype fp8), in either
  // config's spelling; another KV quantization is refused by name.
  json fp8_kv = {{"quantization", {{"quant_algo", "NVFP4"}, {"kv_cache_quant_algo", "FP8"}, {"group_size", 16}}}};
  auto kv = load(folder_with("fp8kv", qwen3_moe_config(), &fp8_kv));
  ASSERT_TRUE(kv.is_ok()) << kv.status().message();
  EXPECT_TRUE(kv->kv_cache_fp8);
  json embedded_kv = qwen3_moe_config();
  embedded_kv["quantization_config"] = {{"quant_method", "modelopt"},
                                        {"quant_algo", "NVFP4"},
                                        {"kv_cache_scheme", {{"dynamic", false}, {"num_bits", 8}, {"type", "float"}}}};
  auto kv2 = load(folder_with("fp8kv2", embedded_kv, nullptr));
  ASSERT_TRUE(kv2.is_ok()) << kv2.status().message();
  EXPECT_TRUE(kv2->kv_cache_fp8);
  json int8_kv = {{"quantization", {{"quant_algo", "NVFP4"}, {"kv_cache_quant_algo", "INT8"}, {"group_size", 16}}}};
  auto a = load(folder_with("int8kv", qwen3_moe_config(), &int8_kv));
  ASSERT_FALSE(a.is_ok());
  EXPECT_NE(a.status().message().find("KV-cache quantization (\"INT8\") is not supported (FP8 only"), std::string::npos)
      << a.status().message();
  json fp8 = {{"quantization", {{"quant_algo", "FP8"}}}};
  auto b = load(folder_with("fp8", qwen3_moe_config(), &fp8));
  ASSERT_FALSE(b.is_ok());
  EXPECT_NE(b.status().message().find("quant_algo 'FP8' is not supported yet"), std::string::npos);
  json c = qwen3_moe_config();
  c["quantization_config"] = {{"quant_method", "compressed-tensors"}};
  auto d = load(folder_with("ct", c, nullptr));
  ASSERT_FALSE(d.is_ok());
  EXPECT_NE(d.status().message().find("quant_method 'compressed-tensors' is not supported yet"), std::string::npos);
  json g32 = {{"quantization", {{"quant_algo", "NVFP4"}, {"group_size", 32}}}};
  auto e = load(folder_with("g32", qwen3_moe_config(), &g32));
  ASSERT_FALSE(e.is_ok());
  EXPECT_NE(e.status().message().find("group_size 32 is not supported"), std::string::npos);
}
