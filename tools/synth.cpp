// Synthetic checkpoint writer. Weights: normal(0, 0.02) before NVFP4 quantization (ModelOpt-exact,
// formats::quantize_weight); q/k/v and each gate/up pair share weight_scale_2 and input_scale, as
// ModelOpt's export fuses them; norms near 1; router rows with varied scales so routing is uneven
// (--router-skew places them for a Zipf load instead: synth_routers.h); input_scales from plausible
// activation ranges.
#include "tools/synth.h"
#include "tools/synth_tokenizer.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "core/env.h"
#include "core/parallel.h"
#include "formats/e4m3.h"
#include "formats/bf16.h"
#include "formats/nvfp4.h"
#include "formats/nvfp4_block.h"
#include "io/quant_config.h"
#include "io/safetensors.h"
#include "io/weight_plan.h"
#include "tools/fast_random.h"

namespace nibble::tools {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

struct Preset {
  io::ModelConfig config;
  uint64_t shard_bytes;
};

// Qwen3-30B-A3B: config.json of Qwen/Qwen3-30B-A3B (and nvidia/Qwen3-30B-A3B-NVFP4).
Preset qwen3_30b_a3b() {
  io::ModelConfig c;
  c.architecture = "Qwen3MoeForCausalLM";
  c.vocab_size = 151936;
  c.hidden_size = 2048;
  c.num_hidden_layers = 48;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 4;
  c.head_dim = 128;
  c.intermediate_size = 6144;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1e6;
  c.max_position_embeddings = 40960;
  c.num_experts = 128;
  c.num_experts_per_tok = 8;
  c.moe_intermediate_size = 768;
  c.eos_token_ids = {151645};
  return {c, 5'000'000'000ull};
}

// Qwen3-235B-A22B: config.json of Qwen/Qwen3-235B-A22B (the same family, 94 layers of hidden 4096,
// 64 query and 4 KV heads, 128 experts of width 1536, top-8): ~130 GB in NVFP4, larger than one GPU.
Preset qwen3_235b_a22b() {
  Preset p = qwen3_30b_a3b();
  io::ModelConfig& c = p.config;
  c.hidden_size = 4096;
  c.num_hidden_layers = 94;
  c.num_attention_heads = 64;
  c.intermediate_size = 12288;
  c.moe_intermediate_size = 1536;
  return p;
}

// A few MB: tiny dimensions, the real vocabulary (so the real tokenizer works), tied embeddings.
Preset tiny_moe() {
  Preset p = qwen3_30b_a3b();
  io::ModelConfig& c = p.config;
  c.hidden_size = 32;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.intermediate_size = 64;
  c.num_experts = 8;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 32;
  c.tie_word_embeddings = true;
  p.shard_bytes = 4'000'000;
  return p;
}

// The smallest shapes the GPU kernels take (hidden and moe_intermediate multiples of 64), Qwen3's
// GQA 4:1 with head_dim 64: GPU-vs-CPU tests in seconds.
Preset small_moe() {
  Preset p = qwen3_30b_a3b();
  io::ModelConfig& c = p.config;
  c.hidden_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.intermediate_size = 256;
  c.num_experts = 16;
  c.num_experts_per_tok = 4;
  c.moe_intermediate_size = 64;
  p.shard_bytes = 40'000'000;
  return p;
}

// ERNIE-4.5-21B-A3B: config.json of baidu/ERNIE-4.5-21B-A3B-PT, which is also Ernie4_5_MoeConfig's
// defaults in transformers 5.24 (a dense first layer, 64 experts top-6 plus 2 shared, tied embeddings).
Preset ernie_4_5_21b_a3b() {
  io::ModelConfig c;
  c.architecture = "Ernie4_5_MoeForCausalLM";
  c.vocab_size = 103424;
  c.hidden_size = 2560;
  c.num_hidden_layers = 28;
  c.num_attention_heads = 20;
  c.num_key_value_heads = 4;
  c.head_dim = 128;
  c.intermediate_size = 12288;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 500000.0;
  c.rope_style = io::RopeStyle::INTERLEAVED;
  c.qk_norm = false;
  c.max_position_embeddings = 131072;
  c.tie_word_embeddings = true;
  c.num_experts = 64;
  c.num_experts_per_tok = 6;
  c.moe_intermediate_size = 1536;
  c.moe_num_shared_experts = 2;
  c.moe_layer_start = 1;
  c.moe_layer_end = 27;
  c.router_fp32 = true;
  c.router_score_bias = true;
  c.moe_norm_min = 1e-12;
  c.eos_token_ids = {2};
  return {c, 5'000'000'000ull};
}

// ERNIE-4.5-300B-A47B (FastDeploy's flagship; baidu/ERNIE-4.5-300B-A47B-PT's config.json): 54 layers of
// hidden 8192, 64 query and 8 KV heads, three dense layers (width 28672) then MoE layers 3..53 of 64
// experts of width 3584, top-8, no shared experts, untied lm_head: ~171 GB in NVFP4.
Preset ernie_4_5_300b_a47b() {
  Preset p = ernie_4_5_21b_a3b();
  io::ModelConfig& c = p.config;
  c.hidden_size = 8192;
  c.num_hidden_layers = 54;
  c.num_attention_heads = 64;
  c.num_key_value_heads = 8;
  c.intermediate_size = 28672;
  c.tie_word_embeddings = false;
  c.num_experts = 64;
  c.num_experts_per_tok = 8;
  c.moe_intermediate_size = 3584;
  c.moe_num_shared_experts = 0;
  c.moe_layer_start = 3;
  c.moe_layer_end = 53;
  return p;
}

// ERNIE at a few MB, with a small synthetic SentencePiece tokenizer (synth_tokenizer.cpp).
Preset tiny_ernie() {
  Preset p = ernie_4_5_21b_a3b();
  io::ModelConfig& c = p.config;
  c.vocab_size = ERNIE_SYNTH_TOKENIZER_PIECES;
  c.hidden_size = 64;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.intermediate_size = 128;
  c.num_experts = 8;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 32;
  c.moe_layer_end = 2;
  p.shard_bytes = 8'000'000;
  return p;
}

// The smallest ERNIE the GPU kernels take on their fast paths (hidden and moe_intermediate multiples
// of 128), with ERNIE-4.5-21B-A3B's GQA group of 5 and a dense first layer: GPU-vs-CPU tests.
Preset small_ernie() {
  Preset p = ernie_4_5_21b_a3b();
  io::ModelConfig& c = p.config;
  c.vocab_size = ERNIE_SYNTH_TOKENIZER_PIECES;
  c.hidden_size = 640;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 10;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.intermediate_size = 512;
  c.num_experts = 16;
  c.num_experts_per_tok = 4;
  c.moe_intermediate_size = 128;
  c.moe_layer_end = 2;
  p.shard_bytes = 200'000'000;
  return p;
}

Result<Preset> find_preset(const SynthOptions& o) {
  Preset p;
  if (o.preset == "tiny-moe")
    p = tiny_moe();
  else if (o.preset == "small-moe")
    p = small_moe();
  else if (o.preset == "qwen3-30b-a3b")
    p = qwen3_30b_a3b();
  else if (o.preset == "qwen3-235b-a22b")
    p = qwen3_235b_a22b();
  else if (o.preset == "tiny-ernie")
    p = tiny_ernie();
  else if (o.preset == "small-ernie")
    p = small_ernie();
  else if (o.preset == "ernie-4.5-21b-a3b")
    p = ernie_4_5_21b_a3b();
  else if (o.preset == "ernie-4.5-300b-a47b")
    p = ernie_4_5_300b_a47b();
  else {
    std::string names;
    for (const std::string& n : synth_presets()) names += (names.empty() ? "" : ", ") + n;
    return Status::error("unknown preset '" + o.preset + "' (presets: " + names + ")");
  }
  if (o.layers < 0 || o.experts < 0) return Status::error("--layers and --experts must be positive");
  if (o.layers > 0) {
    p.config.num_hidden_layers = o.layers;
    if (p.config.moe_layer_end >= o.layers) p.config.moe_layer_end = o.layers - 1;
  }
  if (o.experts > 0) {
    p.config.num_experts = o.experts;
    p.config.num_experts_per_tok = std::min(p.config.num_experts_per_tok, o.experts);
  }
  if (o.shard_bytes > 0) p.shard_bytes = o.shard_bytes;
  return p;
}

// config.json as transformers 5.24's Ernie4_5_MoeConfig.save_pretrained writes it.
json ernie_config_json(const io::ModelConfig& c, const json& quantization_config) {
  return {
      {"architectures", {c.architecture}},
      {"model_type", "ernie4_5_moe"},
      {"bos_token_id", 1},
      {"eos_token_id", c.eos_token_ids.size() == 1 ? json(c.eos_token_ids[0]) : json(c.eos_token_ids)},
      {"pad_token_id", 0},
      {"head_dim", c.head_dim},
      {"hidden_act", "silu"},
      {"hidden_size", c.hidden_size},
      {"initializer_range", 0.02},
      {"intermediate_size", c.intermediate_size},
      {"max_position_embeddings", c.max_position_embeddings},
      {"moe_intermediate_size", c.moe_intermediate_size},
      {"moe_k", c.num_experts_per_tok},
      {"moe_layer_end_index", c.moe_layer_end},
      {"moe_layer_interval", c.decoder_sparse_step},
      {"moe_layer_start_index", c.moe_layer_start},
      {"moe_norm_min", c.moe_norm_min},
      {"moe_num_experts", c.num_experts},
      {"moe_num_shared_experts", c.moe_num_shared_experts},
      {"num_attention_heads", c.num_attention_heads},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_key_value_heads", c.num_key_value_heads},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_parameters", {{"rope_theta", c.rope_theta}, {"rope_type", "default"}}},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"torch_dtype", "bfloat16"},
      {"use_bias", false},
      {"use_cache", true},
      {"vocab_size", c.vocab_size},
      {"quantization_config", quantization_config},
  };
}

json config_json(const io::ModelConfig& c, const json& quantization_config) {
  if (c.architecture == "Ernie4_5_MoeForCausalLM") return ernie_config_json(c, quantization_config);
  json j = {
      {"architectures", {c.architecture}},
      {"model_type", c.is_moe() ? "qwen3_moe" : "qwen3"},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"bos_token_id", 151643},
      {"eos_token_id", c.eos_token_ids.size() == 1 ? json(c.eos_token_ids[0]) : json(c.eos_token_ids)},
      {"head_dim", c.head_dim},
      {"hidden_act", "silu"},
      {"hidden_size", c.hidden_size},
      {"initializer_range", 0.02},
      {"intermediate_size", c.intermediate_size},
      {"max_position_embeddings", c.max_position_embeddings},
      {"max_window_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_key_value_heads", c.num_key_value_heads},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_scaling", nullptr},
      {"rope_theta", c.rope_theta},
      {"sliding_window", nullptr},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"torch_dtype", "bfloat16"},
      {"use_cache", true},
      {"use_sliding_window", false},
      {"vocab_size", c.vocab_size},
      {"quantization_config", quantization_config},
  };
  if (c.is_moe()) {
    j["decoder_sparse_step"] = c.decoder_sparse_step;
    j["mlp_only_layers"] = c.mlp_only_layers;
    j["moe_intermediate_size"] = c.moe_intermediate_size;
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["num_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["output_router_logits"] = false;
    j["router_aux_loss_coef"] = 0.001;
  }
  return j;
}

Status write_json(const fs::path& path, const json& j) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  return out ? Status::ok() : Status::error(path.string() + ": cannot write");
}

// Modules generated together because they share weight_scale_2 and input_scale in a ModelOpt
// export (q/k/v; gate/up of one MLP or expert); everything else alone.
std::vector<std::vector<const io::ModuleSpec*>> generation_groups(const std::vector<io::ModuleSpec>& modules) {
  std::vector<std::vector<const io::ModuleSpec*>> groups;
  std::map<std::string, size_t> fused;  // fusion key → group index
  for (const io::ModuleSpec& m : modules) {
    std::string key;
    const std::string stem = m.name.substr(0, m.name.rfind('.') + 1);
    if (m.name.ends_with("q_proj") || m.name.ends_with("k_proj") || m.name.ends_with("v_proj"))
      key = stem + "qkv";
    else if (m.name.ends_with("gate_proj") || m.name.ends_with("up_proj"))
      key = stem + "gate_up";
    if (key.empty()) {
      groups.push_back({&m});
    } else if (auto it = fused.find(key); it != fused.end()) {
      groups[it->second].push_back(&m);
    } else {
      fused[key] = groups.size();
      groups.push_back({&m});
    }
  }
  return groups;
}

Status write_f32(io::ShardedWriter& writer, const std::string& name, float v) {
  uint8_t bytes[sizeof v];
  std::memcpy(bytes, &v, sizeof v);
  return writer.write(name, bytes);
}

// n normal(mean, stddev) values as BF16 bytes, drawn a chunk at a time (a scalar tail when n is
// not a multiple of 16). Built for AVX2 too.
__attribute__((target_clones("avx2", "default"))) std::vector<uint8_t> normal_bf16(size_t n, FastRandom& rng,
                                                                                   float mean, float stddev) {
  std::vector<uint8_t> out(n * 2);
  constexpr size_t CHUNK = 4096;
  float chunk[CHUNK];
  uint16_t encoded[CHUNK];
  for (size_t first = 0; first < n; first += CHUNK) {
    const size_t count = std::min(CHUNK, n - first), whole = count / 16 * 16;
    rng.fill_normals(chunk, whole);
    for (size_t i = whole; i < count; ++i) chunk[i] = rng.normal();
    for (size_t i = 0; i < count; ++i) encoded[i] = formats::bf16_encode(mean + stddev * chunk[i]);
    std::memcpy(out.data() + 2 * first, encoded, 2 * count);
  }
  return out;
}

// normal(0, 0.02) weights drawn a chunk at a time (FastRandom::fill_normals, L1-sized) and
// quantized as ModelOpt rounds (formats::quantize_weight_block); `planted` (if not 0) replaces the
// first weight. Built for AVX2 too, picked at run time.
__attribute__((target_clones("avx2", "default"))) void draw_nvfp4_weight(FastRandom& rng, size_t n_blocks,
                                                                         float scale_2, float planted, uint8_t* packed,
                                                                         uint8_t* block_scales) {
  constexpr size_t CHUNK_BLOCKS = 256;
  float chunk[CHUNK_BLOCKS * formats::NVFP4_BLOCK];
  for (size_t first = 0; first < n_blocks; first += CHUNK_BLOCKS) {
    const size_t blocks = std::min(CHUNK_BLOCKS, n_blocks - first);
    rng.fill_normals(chunk, blocks * formats::NVFP4_BLOCK);
    for (size_t i = 0; i < blocks * formats::NVFP4_BLOCK; ++i) chunk[i] *= 0.02f;
    if (first == 0 && planted != 0.0f) chunk[0] = planted;
    for (size_t b = 0; b < blocks; ++b)
      block_scales[first + b] = formats::quantize_weight_block(chunk + b * formats::NVFP4_BLOCK, scale_2,
                                                               packed + (first + b) * (formats::NVFP4_BLOCK / 2));
  }
}

size_t numel(const io::ModuleSpec& m) {
  size_t n = 1;
  for (int64_t d : m.shape) n *= static_cast<size_t>(d);
  return n;
}

Status generate_weights(const std::vector<const io::ModuleSpec*>& group, uint64_t seed, io::ShardedWriter& writer) {
  const io::ModuleSpec& first = *group[0];
  FastRandom rng(seed, first.name);
  if (first.kind == io::ModuleKind::NORM) {
    return writer.write(first.name + ".weight", normal_bf16(numel(first), rng, 1.0f, 0.05f));
  }
  if (first.dtype == DType::F32) {  // ERNIE's router (rows of varied scale) and its correction bias
    std::vector<float> values(numel(first));
    const int64_t cols = first.shape.back();
    float row_scale = 0.0f;
    for (size_t i = 0; i < values.size(); ++i) {
      if (i % static_cast<size_t>(cols) == 0) row_scale = 0.02f * std::exp(0.5f * rng.normal());
      values[i] = first.kind == io::ModuleKind::TENSOR ? 0.01f * rng.normal() : row_scale * rng.normal();
    }
    const auto* bytes = reinterpret_cast<const uint8_t*>(values.data());
    return writer.write(first.tensors()[0].name, std::span<const uint8_t>(bytes, values.size() * sizeof(float)));
  }
  if (first.kind == io::ModuleKind::EMBEDDING || !first.quantized) {
    if (first.role == io::ModuleRole::ROUTER) {
      // Router: each expert's row gets its own scale (log-normal), so some experts win more often.
      const size_t cols = static_cast<size_t>(first.shape[1]);
      std::vector<uint8_t> rows;
      for (int64_t e = 0; e < first.shape[0]; ++e) {
        const auto row = normal_bf16(cols, rng, 0.0f, 0.02f * std::exp(0.5f * rng.normal()));
        rows.insert(rows.end(), row.begin(), row.end());
      }
      return writer.write(first.name + ".weight", rows);
    }
    for (const io::ModuleSpec* m : group)
      NIB_RETURN_IF_ERROR(writer.write(m->name + ".weight", normal_bf16(numel(*m), rng, 0.0f, 0.02f)));
    return Status::ok();
  }
  // NVFP4 linears, drawn and quantized block by block (no float buffer). The group's shared
  // weight_scale_2 is amax / 2688 as ModelOpt computes it; the amax is known before drawing because
  // the first weight is planted at the largest magnitude the generator can produce.
  const float planted = 0.02f * FastRandom::max_abs_normal();
  const float scale_2 = planted / formats::NVFP4_SCALE_RANGE;
  // Calibrated activation amax: inputs after RMSNorm reach ~2..20; SwiGLU outputs and attention
  // outputs are smaller.
  const bool small_input = first.name.ends_with("down_proj") || first.name.ends_with("o_proj");
  const float amax = (small_input ? 0.5f : 2.0f) * (1.0f + 9.0f * rng.uniform());
  const float input_scale = amax / formats::NVFP4_SCALE_RANGE;
  thread_local std::vector<uint8_t> packed, block_scales;  // reused: fresh buffers would page-fault per group
  for (size_t i = 0; i < group.size(); ++i) {
    const io::ModuleSpec& m = *group[i];
    packed.resize(numel(m) / 2);
    block_scales.resize(numel(m) / formats::NVFP4_BLOCK);
    draw_nvfp4_weight(rng, numel(m) / formats::NVFP4_BLOCK, scale_2, i == 0 ? planted : 0.0f, packed.data(),
                      block_scales.data());
    NIB_RETURN_IF_ERROR(writer.write(m.name + ".weight", packed));
    NIB_RETURN_IF_ERROR(writer.write(m.name + ".weight_scale", block_scales));
    NIB_RETURN_IF_ERROR(write_f32(writer, m.name + ".weight_scale_2", scale_2));
    NIB_RETURN_IF_ERROR(write_f32(writer, m.name + ".input_scale", input_scale));
  }
  return Status::ok();
}

// A group's weights, then the FP8 KV-cache scales of its k_proj and v_proj where the checkpoint has
// them: amax / 448 (ModelOpt's calibration) for K after its norm and RoPE (~2–8) and V (~1–4).
Status generate_group(const std::vector<const io::ModuleSpec*>& group, uint64_t seed, io::ShardedWriter& writer) {
  NIB_RETURN_IF_ERROR(generate_weights(group, seed, writer));
  for (const io::ModuleSpec* m : group) {
    if (!m->kv_scale) continue;
    FastRandom rng(seed, m->name + ".kv_scale");
    const bool k = m->role == io::ModuleRole::K_PROJ;
    const float amax = (k ? 2.0f : 1.0f) * (1.0f + 3.0f * rng.uniform());
    NIB_RETURN_IF_ERROR(write_f32(writer, m->tensors().back().name, amax / formats::E4M3_MAX));
  }
  return Status::ok();
}

io::QuantConfig synth_quant_config(const io::ModelConfig& c, bool quantize_attention, bool kv_cache_fp8) {
  io::QuantConfig q;
  q.nvfp4 = true;
  q.kv_cache_fp8 = kv_cache_fp8;
  q.exclude_modules.push_back("lm_head");
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    if (c.is_moe_layer(l)) q.exclude_modules.push_back(p + ".mlp.gate");
    if (!quantize_attention) q.exclude_modules.push_back(p + ".self_attn*");
  }
  return q;
}

}  // namespace

const std::vector<std::string>& synth_presets() {
  static const std::vector<std::string> presets = {
      "tiny-moe",   "small-moe",   "qwen3-30b-a3b",     "qwen3-235b-a22b",
      "tiny-ernie", "small-ernie", "ernie-4.5-21b-a3b", "ernie-4.5-300b-a47b"};
  return presets;
}

Result<io::ModelConfig> synth_config(const SynthOptions& options) {
  Result<Preset> preset = find_preset(options);
  if (!preset) return preset.status();
  // Round-trip through config.json parsing so the preset is validated like any checkpoint.
  const json j = config_json(preset->config, nullptr);
  return io::parse_model_config(j.dump(), "preset " + options.preset);
}

Result<uint64_t> synth_total_bytes(const SynthOptions& options) {
  Result<io::ModelConfig> config = synth_config(options);
  if (!config) return config.status();
  uint64_t total = 0;
  for (const auto& m :
       io::plan_modules(*config, synth_quant_config(*config, options.quantize_attention, options.kv_cache_fp8)))
    total += m.nbytes();
  return total;
}

Result<SynthReport> synth_checkpoint(const SynthOptions& options) {
  Result<Preset> preset = find_preset(options);
  if (!preset) return preset.status();
  Result<io::ModelConfig> config = synth_config(options);
  if (!config) return config.status();
  const io::QuantConfig quant = synth_quant_config(*config, options.quantize_attention, options.kv_cache_fp8);
  const std::vector<io::ModuleSpec> modules = io::plan_modules(*config, quant);

  std::vector<io::TensorSpec> tensors;
  for (const io::ModuleSpec& m : modules)
    for (io::TensorSpec& t : m.tensors()) tensors.push_back(std::move(t));
  auto writer = io::ShardedWriter::create(options.out_dir, tensors, preset->shard_bytes, {{"format", "pt"}});
  if (!writer) return writer.status();

  const auto start = std::chrono::steady_clock::now();
  const auto groups = generation_groups(modules);
  std::vector<Status> statuses(groups.size());
  parallel_for(groups.size(), [&](size_t g) {
    statuses[g] = generate_group(groups[g], options.seed, **writer);
    if (options.bytes_done) {
      uint64_t bytes = 0;
      for (const io::ModuleSpec* m : groups[g]) bytes += m->nbytes();
      *options.bytes_done += bytes;
    }
  });
  for (const Status& s : statuses) NIB_RETURN_IF_ERROR(s);
  const auto generated = std::chrono::steady_clock::now();
  NIB_RETURN_IF_ERROR((*writer)->finish());
  const auto flushed = std::chrono::steady_clock::now();

  // Configs: hf_quant_config.json and the embedded form ModelOpt also writes into config.json.
  const json producer = {{"name", "modelopt"}, {"version", "0.47.0"}};
  const json hf_quant = {{"producer", producer},
                         {"quantization",
                          {{"quant_algo", "NVFP4"},
                           {"kv_cache_quant_algo", options.kv_cache_fp8 ? json("FP8") : json(nullptr)},
                           {"group_size", 16},
                           {"exclude_modules", quant.exclude_modules}}}};
  const json group = {{"dynamic", false}, {"num_bits", 4}, {"type", "float"}, {"group_size", 16}};
  json embedded = {
      {"config_groups", {{"group_0", {{"input_activations", group}, {"weights", group}, {"targets", {"Linear"}}}}}},
      {"ignore", quant.exclude_modules},
      {"quant_algo", "NVFP4"},
      {"producer", producer},
      {"quant_method", "modelopt"}};
  if (options.kv_cache_fp8) embedded["kv_cache_scheme"] = {{"dynamic", false}, {"num_bits", 8}, {"type", "float"}};
  const fs::path dir(options.out_dir);
  NIB_RETURN_IF_ERROR(write_json(dir / "config.json", config_json(*config, embedded)));
  NIB_RETURN_IF_ERROR(write_json(dir / "hf_quant_config.json", hf_quant));
  NIB_RETURN_IF_ERROR(write_tokenizer_files(*config, options.out_dir, data_dir()));
  SynthReport report;
  report.config = *config;
  for (const auto& t : tensors) report.total_bytes += t.nbytes();
  report.n_shards = (*writer)->shard_files().size();
  report.generate_seconds = std::chrono::duration<double>(generated - start).count();
  report.flush_seconds = std::chrono::duration<double>(flushed - generated).count();
  if (options.router_skew >= 0) {
    Result<std::vector<LayerRouting>> routing =
        place_synth_routers(options.out_dir, options.router_skew, options.seed, options.router_tokens);
    if (!routing) return routing.status();
    report.routing = std::move(*routing);
    report.routing_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - flushed).count();
  }
  return report;
}

std::string data_dir() {
  if (const char* env = env_value("NIBBLE_DATA_DIR")) return env;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec && fs::exists(exe.parent_path().parent_path() / "data" / "qwen3-tokenizer")) {
    return (exe.parent_path().parent_path() / "data").string();
  }
  return NIBBLE_SOURCE_DATA_DIR;
}

}  // namespace nibble::tools
