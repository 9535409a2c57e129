// Checkpoint binding on synthetic checkpoints: a good one binds; broken ones report every problem
// (missing, extra, mis-shaped, wrong format, bad scales) in one error.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "io/binding.h"
#include "tools/synth.h"

using namespace nibble;
using namespace nibble::io;
namespace fs = std::filesystem;

namespace {

fs::path synth_tiny(const std::string& name, bool quantize_attention = true, bool kv_cache_fp8 = false) {
  fs::path dir = fs::temp_directory_path() / ("nibble_bind_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(dir);
  tools::SynthOptions o;
  o.preset = "tiny-moe";
  o.out_dir = dir.string();
  o.seed = 3;
  o.quantize_attention = quantize_attention;
  o.kv_cache_fp8 = kv_cache_fp8;
  auto r = tools::synth_checkpoint(o);
  EXPECT_TRUE(r.is_ok()) << r.status().message();
  return dir;
}

// Rewrites the checkpoint's tensors through `edit`, which may drop, add or change specs; tensor
// bytes are copied from the original where the name and size still match, else filled with 0x11.
void rewrite(const fs::path& dir, const std::function<void(std::vector<TensorSpec>&)>& edit) {
  std::map<std::string, std::vector<uint8_t>> old_data;
  std::vector<TensorSpec> specs;
  {
    auto reader = SafetensorsReader::open(dir.string());
    ASSERT_TRUE(reader.is_ok());
    for (const auto& [name, e] : reader->tensors()) {
      specs.push_back({name, e.info->dtype, e.info->shape});
      auto d = reader->data(e);
      old_data[name] = {d.begin(), d.end()};
    }
  }
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().extension() == ".safetensors" || entry.path().filename() == "model.safetensors.index.json")
      fs::remove(entry.path());
  edit(specs);
  auto writer = ShardedWriter::create(dir.string(), specs, 1ull << 40, {});
  ASSERT_TRUE(writer.is_ok());
  for (const TensorSpec& t : specs) {
    auto it = old_data.find(t.name);
    std::vector<uint8_t> bytes(t.nbytes(), 0x11);
    if (it != old_data.end() && it->second.size() == bytes.size()) bytes = it->second;
    ASSERT_TRUE((*writer)->write(t.name, bytes).is_ok());
  }
  ASSERT_TRUE((*writer)->finish().is_ok());
}

}  // namespace

// The full-size presets have their published shapes, and their checkpoints the sizes those give (NVFP4
// weights: 4.5 bits a parameter with the block scales; embeddings, norms and the router in BF16).
TEST(SynthPresets, FullSizeShapesAndBytes) {
  struct Want {
    const char* preset;
    int64_t layers, hidden, heads, kv_heads, experts, top_k, moe_width;
    double min_gb, max_gb;
  };
  for (const Want& w : {Want{"qwen3-30b-a3b", 48, 2048, 32, 4, 128, 8, 768, 17.5, 18.5},
                        Want{"qwen3-235b-a22b", 94, 4096, 64, 4, 128, 8, 1536, 130.0, 138.0},
                        Want{"ernie-4.5-300b-a47b", 54, 8192, 64, 8, 64, 8, 3584, 165.0, 178.0}}) {
    tools::SynthOptions o;
    o.preset = w.preset;
    auto c = tools::synth_config(o);
    ASSERT_TRUE(c.is_ok()) << c.status().message();
    EXPECT_EQ(c->num_hidden_layers, w.layers) << w.preset;
    EXPECT_EQ(c->hidden_size, w.hidden) << w.preset;
    EXPECT_EQ(c->num_attention_heads, w.heads) << w.preset;
    EXPECT_EQ(c->num_key_value_heads, w.kv_heads) << w.preset;
    EXPECT_EQ(c->head_dim, 128) << w.preset;
    EXPECT_EQ(c->num_experts, w.experts) << w.preset;
    EXPECT_EQ(c->num_experts_per_tok, w.top_k) << w.preset;
    EXPECT_EQ(c->moe_intermediate_size, w.moe_width) << w.preset;
    auto bytes = tools::synth_total_bytes(o);
    ASSERT_TRUE(bytes.is_ok()) << bytes.status().message();
    EXPECT_GE(*bytes / 1e9, w.min_gb) << w.preset;
    EXPECT_LE(*bytes / 1e9, w.max_gb) << w.preset;
  }
}

TEST(Binding, SynthCheckpointBinds) {
  const fs::path dir = synth_tiny("good");
  auto loaded = load_checkpoint(dir.string());
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  const BoundCheckpoint& b = (*loaded)->bound;
  EXPECT_TRUE(b.quant.nvfp4);
  const LinearWeights& up = b.linears.at("model.layers.1.mlp.experts.5.up_proj");
  EXPECT_TRUE(up.module.quantized);
  EXPECT_EQ(up.weight.dtype, DType::U8);
  EXPECT_EQ(up.weight.shape, (std::vector<int64_t>{32, 16}));
  EXPECT_GT(up.weight_scale_2, 0.0f);
  EXPECT_GT(up.input_scale, 0.0f);
  EXPECT_EQ(up.weight_scale_2, b.linears.at("model.layers.1.mlp.experts.5.gate_proj").weight_scale_2);
  EXPECT_FALSE(b.linears.at("model.layers.0.mlp.gate").module.quantized);  // router excluded
  EXPECT_EQ(b.linears.count("lm_head"), 0u);                               // tied embeddings
  EXPECT_EQ(b.experts_with_split_gate_up_scale, 0);
  EXPECT_EQ(b.tensors.at("model.norm.weight").shape, std::vector<int64_t>{32});
  fs::remove_all(dir);
}

TEST(Binding, AttentionInBf16WhenExcluded) {
  const fs::path dir = synth_tiny("bf16attn", false);
  auto loaded = load_checkpoint(dir.string());
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  const LinearWeights& q = (*loaded)->bound.linears.at("model.layers.0.self_attn.q_proj");
  EXPECT_FALSE(q.module.quantized);
  EXPECT_EQ(q.weight.dtype, DType::BF16);
  fs::remove_all(dir);
}

// A checkpoint with ModelOpt's FP8 KV-cache calibration: each layer's k_proj.k_scale and v_proj.v_scale
// (amax / 448) are read; a missing one is named; a BF16-attention checkpoint carries them too.
TEST(Binding, Fp8KvCacheScalesAreRead) {
  for (bool quantized : {true, false}) {
    const fs::path dir = synth_tiny(quantized ? "kvscales" : "kvscales_bf16", quantized, true);
    auto loaded = load_checkpoint(dir.string());
    ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
    const BoundCheckpoint& b = (*loaded)->bound;
    EXPECT_TRUE(b.quant.kv_cache_fp8);
    for (int64_t l = 0; l < b.config.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
      for (const char* proj : {"k_proj", "v_proj"}) {
        const float s = b.linears.at(p + proj).kv_scale;
        EXPECT_GT(s, 0.5f / 448) << p + proj;
        EXPECT_LT(s, 9.0f / 448) << p + proj;
      }
      EXPECT_EQ(b.linears.at(p + "q_proj").kv_scale, 1.0f);
    }
    rewrite(dir, [](std::vector<TensorSpec>& specs) {
      std::erase_if(specs, [](const TensorSpec& t) { return t.name == "model.layers.1.self_attn.v_proj.v_scale"; });
    });
    auto broken = load_checkpoint(dir.string());
    ASSERT_FALSE(broken.is_ok());
    EXPECT_NE(broken.status().message().find("missing tensor model.layers.1.self_attn.v_proj.v_scale"),
              std::string::npos)
        << broken.status().message();
    fs::remove_all(dir);
  }
}

TEST(Binding, EveryProblemReportedAtOnce) {
  const fs::path dir = synth_tiny("broken");
  rewrite(dir, [](std::vector<TensorSpec>& specs) {
    std::erase_if(specs, [](const TensorSpec& t) {
      return t.name == "model.layers.0.self_attn.k_norm.weight" ||
             t.name == "model.layers.1.mlp.experts.2.down_proj.weight_scale";
    });
    for (TensorSpec& t : specs) {
      if (t.name == "model.layers.0.mlp.experts.0.up_proj.weight") t.shape = {32, 32};
      if (t.name == "model.norm.weight") t.dtype = DType::F32;
    }
    specs.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", DType::F32, {8}});
  });
  auto loaded = load_checkpoint(dir.string());
  ASSERT_FALSE(loaded.is_ok());
  const std::string& e = loaded.status().message();
  EXPECT_NE(e.find("(5 problems)"), std::string::npos) << e;
  EXPECT_NE(e.find("missing tensor model.layers.0.self_attn.k_norm.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("missing tensor model.layers.1.mlp.experts.2.down_proj.weight_scale"), std::string::npos) << e;
  EXPECT_NE(e.find("model.layers.0.mlp.experts.0.up_proj.weight: expected U8 [32, 16], file has U8 [32, 32]"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("model.norm.weight: expected BF16 [32], file has F32 [32]"), std::string::npos) << e;
  EXPECT_NE(e.find("unexpected tensor model.layers.0.self_attn.rotary_emb.inv_freq"), std::string::npos) << e;
  fs::remove_all(dir);
}

TEST(Binding, QuantizedModuleThatConfigExcludes) {
  const fs::path dir = synth_tiny("excluded");
  // Declare attention excluded in hf_quant_config.json while the file holds NVFP4 attention.
  std::ifstream in(dir / "hf_quant_config.json");
  nlohmann::json hf = nlohmann::json::parse(in);
  hf["quantization"]["exclude_modules"].push_back("model.layers.0.self_attn.o_proj");
  std::ofstream(dir / "hf_quant_config.json") << hf.dump();
  auto loaded = load_checkpoint(dir.string());
  ASSERT_FALSE(loaded.is_ok());
  EXPECT_NE(loaded.status().message().find("model.layers.0.self_attn.o_proj is NVFP4 in the file but unquantized"),
            std::string::npos)
      << loaded.status().message();
  fs::remove_all(dir);
}

TEST(Binding, SplitGateUpScalesCountedAndBadScalesRejected) {
  const fs::path dir = synth_tiny("scales");
  rewrite(dir, [](std::vector<TensorSpec>&) {});  // unchanged layout, original bytes
  {
    // Overwrite two scalars in place: a split gate/up scale, and a zero input_scale.
    auto reader = SafetensorsReader::open(dir.string());
    ASSERT_TRUE(reader.is_ok());
    auto patch = [&](const std::string& name, float v) {
      const auto* e = reader->find(name);
      ASSERT_NE(e, nullptr) << name;
      std::fstream f(e->file->path(), std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(static_cast<std::streamoff>(e->info->data_begin));
      f.write(reinterpret_cast<const char*>(&v), sizeof v);
    };
    patch("model.layers.0.mlp.experts.1.up_proj.weight_scale_2", 1.5e-4f);
    patch("model.layers.0.mlp.experts.4.up_proj.weight_scale_2", 2.5e-4f);
  }
  auto loaded = load_checkpoint(dir.string());
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  EXPECT_EQ((*loaded)->bound.experts_with_split_gate_up_scale, 2);
  loaded = Status::error("reset");
  {
    auto reader = SafetensorsReader::open(dir.string());
    const auto* e = reader->find("model.layers.1.self_attn.q_proj.input_scale");
    std::fstream f(e->file->path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(e->info->data_begin));
    const float zero = 0.0f;
    f.write(reinterpret_cast<const char*>(&zero), sizeof zero);
  }
  auto bad = load_checkpoint(dir.string());
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(
      bad.status().message().find("model.layers.1.self_attn.q_proj.input_scale is 0.000000, must be finite and > 0"),
      std::string::npos)
      << bad.status().message();
  fs::remove_all(dir);
}

// Issue 13: a checkpoint whose quant config does not exclude the MoE router (and whose router is
// NVFP4) once bound and then routed on its codes read as BF16. It is a load error naming the tensor;
// the same folder with the router excluded and in BF16 loads (SynthCheckpointBinds).
TEST(Binding, QuantizedRouterIsRefusedByName) {
  const fs::path dir = synth_tiny("qrouter");
  auto is_router = [](const std::string& name) {
    return name.find(".mlp.gate") != std::string::npos && name.find(".mlp.gate_proj") == std::string::npos;
  };
  for (const char* file : {"hf_quant_config.json", "config.json"}) {
    std::ifstream in(dir / file);
    nlohmann::json j = nlohmann::json::parse(in);
    nlohmann::json& list =
        std::string(file) == "config.json" ? j["quantization_config"]["ignore"] : j["quantization"]["exclude_modules"];
    nlohmann::json kept = nlohmann::json::array();
    for (const auto& pattern : list)
      if (!is_router(pattern.get<std::string>())) kept.push_back(pattern);
    list = kept;
    std::ofstream(dir / file) << j.dump();
  }
  rewrite(dir, [&](std::vector<TensorSpec>& specs) {
    std::vector<TensorSpec> routers;
    for (TensorSpec& t : specs) {
      if (!is_router(t.name)) continue;
      const std::string stem = t.name.substr(0, t.name.rfind('.'));
      const int64_t out = t.shape[0], in = t.shape[1];
      t = {stem + ".weight", DType::U8, {out, in / 2}};
      routers.push_back({stem + ".weight_scale", DType::F8_E4M3, {out, in / 16}});
      routers.push_back({stem + ".weight_scale_2", DType::F32, {}});
      routers.push_back({stem + ".input_scale", DType::F32, {}});
    }
    specs.insert(specs.end(), routers.begin(), routers.end());
  });
  auto loaded = load_checkpoint(dir.string());
  ASSERT_FALSE(loaded.is_ok()) << "a quantized router must not bind";
  const std::string& e = loaded.status().message();
  EXPECT_NE(e.find("model.layers.0.mlp.gate.weight: the MoE router is NVFP4"), std::string::npos) << e;
  EXPECT_NE(e.find("(1 problem)"), std::string::npos) << "one line for all layers, no knock-on errors: " << e;
  fs::remove_all(dir);
}
