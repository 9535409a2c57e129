// Checkpoint binding. Problems are collected, not returned one by one, so a user fixing a broken
// export sees everything wrong at once (capped at 50 lines, with the total count).
#include "io/binding.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>

#include "core/log.h"
#include "formats/bf16.h"

namespace nibble::io {
namespace {

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// A 0-d scalar, also accepted as shape [1] (some exporters write it so).
bool is_scalar_shape(const std::vector<int64_t>& shape) {
  return shape.empty() || (shape.size() == 1 && shape[0] == 1);
}

float read_f32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

std::vector<float> read_f32_values(const TensorRef& t) {
  size_t n = 1;
  for (int64_t d : t.shape) n *= static_cast<size_t>(d);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (t.dtype == DType::F32) {
      std::memcpy(&out[i], t.data + 4 * i, 4);
    } else {
      uint16_t bits;
      std::memcpy(&bits, t.data + 2 * i, 2);
      out[i] = formats::bf16_decode(bits);
    }
  }
  return out;
}

Result<BoundCheckpoint> bind_checkpoint(const SafetensorsReader& reader, const ModelConfig& config,
                                        const QuantConfig& quant) {
  BoundCheckpoint out;
  out.config = config;
  out.quant = quant;
  out.modules = plan_modules(config, quant);
  std::vector<std::string> problems;
  std::set<std::string> expected_names;
  int64_t quantized_routers = 0;

  auto lookup = [&](const TensorSpec& spec, TensorRef& ref) {
    expected_names.insert(spec.name);
    const auto* entry = reader.find(spec.name);
    if (!entry) {
      // A BF16 tensor where NVFP4 was expected (or the reverse) is the likeliest cause; say so.
      const std::string stem = spec.name.substr(0, spec.name.rfind('.'));
      const bool has_scale = reader.find(stem + ".weight_scale") != nullptr;
      problems.push_back("missing tensor " + spec.name +
                         (spec.name.ends_with(".weight_scale") && !has_scale
                              ? " (module is NVFP4 per the quant config but the file has no scales: is it excluded?)"
                              : ""));
      return false;
    }
    const TensorInfo& info = *entry->info;
    const bool shape_ok = spec.shape.empty() ? is_scalar_shape(info.shape) : info.shape == spec.shape;
    // An fp32 parameter stored in BF16 is read exactly (ERNIE's router and bias in BF16 exports).
    const bool dtype_ok = info.dtype == spec.dtype || (spec.dtype == DType::F32 && info.dtype == DType::BF16);
    if (!dtype_ok || !shape_ok) {
      problems.push_back(spec.name + ": expected " + std::string(dtype_name(spec.dtype)) + " " +
                         shape_string(spec.shape) + ", file has " + std::string(dtype_name(info.dtype)) + " " +
                         shape_string(info.shape) + " (" + entry->file->path() + ")");
      return false;
    }
    ref = {reader.data(*entry).data(), info.dtype, info.shape};
    return true;
  };

  for (const ModuleSpec& m : out.modules) {
    const std::vector<TensorSpec> specs = m.tensors();
    if (m.kind != ModuleKind::LINEAR) {
      TensorRef ref;
      if (lookup(specs[0], ref)) out.tensors[specs[0].name] = ref;
      continue;
    }
    if (m.role == ModuleRole::ROUTER && m.quantized) {
      // ModelOpt leaves routers in BF16 by default and vLLM/SGLang (like nibble) only run them so;
      // reading a quantized router's codes as BF16 would route on garbage, so refuse by name.
      ++quantized_routers;
      if (quantized_routers == 1)
        problems.push_back(m.name + ".weight: the MoE router is NVFP4 per the quant config (" + quant.source +
                           " does not exclude it); nibble runs routers in BF16 only — re-export with '*mlp.gate' in "
                           "exclude_modules (ModelOpt's default)");
      for (const TensorSpec& t : specs) expected_names.insert(t.name);
      continue;
    }
    LinearWeights lw;
    lw.module = m;
    bool ok = lookup(specs[0], lw.weight);
    // ModelOpt's FP8 KV-cache scales sit on the projections that make K and V
    // (model.layers.N.self_attn.k_proj.k_scale / v_proj.v_scale, fp32 scalars): the last spec.
    if (m.kv_scale) {
      TensorRef kv_scale;
      if (lookup(specs.back(), kv_scale)) {
        lw.kv_scale = read_f32(kv_scale.data);
        if (!std::isfinite(lw.kv_scale) || lw.kv_scale <= 0.0f)
          problems.push_back(specs.back().name + " is " + std::to_string(lw.kv_scale) + ", must be finite and > 0");
      } else {
        ok = false;
      }
    }
    if (m.quantized) {
      TensorRef scale_2, input_scale;
      ok &= lookup(specs[1], lw.weight_scale);
      ok &= lookup(specs[2], scale_2);
      ok &= lookup(specs[3], input_scale);
      if (ok) {
        lw.weight_scale_2 = read_f32(scale_2.data);
        lw.input_scale = read_f32(input_scale.data);
        for (const auto& [label, v] :
             {std::pair{"weight_scale_2", lw.weight_scale_2}, std::pair{"input_scale", lw.input_scale}}) {
          if (!std::isfinite(v) || v <= 0.0f)
            problems.push_back(m.name + "." + label + " is " + std::to_string(v) + ", must be finite and > 0");
        }
      }
    } else if (reader.find(m.name + ".weight_scale")) {
      expected_names.insert(m.name + ".weight_scale");
      problems.push_back(m.name + " is NVFP4 in the file but unquantized per the quant config (" +
                         (quant.nvfp4 ? "excluded by " + quant.source : std::string("no quant config")) + ")");
    }
    if (ok) out.linears[m.name] = lw;
  }
  for (const auto& [name, entry] : reader.tensors()) {
    if (!expected_names.count(name)) problems.push_back("unexpected tensor " + name + " (" + entry.file->path() + ")");
  }

  // Gate and up of one expert usually share weight_scale_2 (ModelOpt export); third-party exports
  // may not, and nibble keeps each half's own scale rather than re-rounding.
  for (const ModuleSpec& m : out.modules) {
    if (m.role != ModuleRole::EXPERT_GATE || !m.quantized) continue;
    const std::string up = m.name.substr(0, m.name.size() - 9) + "up_proj";
    auto g = out.linears.find(m.name), u = out.linears.find(up);
    if (g != out.linears.end() && u != out.linears.end() && g->second.weight_scale_2 != u->second.weight_scale_2)
      ++out.experts_with_split_gate_up_scale;
  }

  if (!problems.empty()) {
    std::string message = "checkpoint does not match " + config.architecture + " (" + std::to_string(problems.size()) +
                          " problem" + (problems.size() > 1 ? "s" : "") + "):";
    for (size_t i = 0; i < problems.size() && i < 50; ++i) message += "\n  " + problems[i];
    if (problems.size() > 50) message += "\n  ... and " + std::to_string(problems.size() - 50) + " more";
    return Status::error(message);
  }
  if (out.experts_with_split_gate_up_scale > 0) {
    log_info(std::to_string(out.experts_with_split_gate_up_scale) +
             " experts have different gate/up weight_scale_2; each half keeps its own scale (exact)");
  }
  return out;
}

Result<std::unique_ptr<LoadedCheckpoint>> load_checkpoint(const std::string& model_dir,
                                                          const ConfigOverrides& overrides,
                                                          const ParallelConfig& parallel) {
  auto loaded = std::make_unique<LoadedCheckpoint>();
  loaded->path = model_dir;
  std::ifstream in(model_dir + "/config.json");
  if (!in) return Status::error(model_dir + "/config.json: cannot open (is this a Hugging Face model folder?)");
  std::stringstream text;
  text << in.rdbuf();
  Result<ModelConfig> config = parse_model_config(text.str(), model_dir + "/config.json", overrides);
  if (!config) return config.status();
  Result<QuantConfig> quant = load_quant_config(model_dir, text.str());
  if (!quant) return quant.status();
  Result<SafetensorsReader> reader = SafetensorsReader::open(model_dir);
  if (!reader) return reader.status();
  loaded->reader = std::move(reader.value());
  Result<BoundCheckpoint> bound = bind_checkpoint(loaded->reader, *config, *quant);
  if (!bound) return bound.status();
  loaded->bound = std::move(bound.value());
  NIB_RETURN_IF_ERROR(keep_rank_slices(*loaded, parallel));
  return loaded;
}

Status check_same_layout(const BoundCheckpoint& current, const BoundCheckpoint& candidate) {
  std::vector<std::string> problems;
  const ModelConfig &a = current.config, &b = candidate.config;
  auto field = [&](const char* name, auto x, auto y) {
    if (x != y) {
      std::ostringstream line;
      line << name << ": " << y << " (serving " << x << ")";
      problems.push_back(line.str());
    }
  };
  field("architecture", a.architecture, b.architecture);
  field("vocab_size", a.vocab_size, b.vocab_size);
  field("hidden_size", a.hidden_size, b.hidden_size);
  field("num_hidden_layers", a.num_hidden_layers, b.num_hidden_layers);
  field("num_attention_heads", a.num_attention_heads, b.num_attention_heads);
  field("num_key_value_heads", a.num_key_value_heads, b.num_key_value_heads);
  field("head_dim", a.head_dim, b.head_dim);
  field("intermediate_size", a.intermediate_size, b.intermediate_size);
  field("num_experts", a.num_experts, b.num_experts);
  field("num_experts_per_tok", a.num_experts_per_tok, b.num_experts_per_tok);
  field("moe_intermediate_size", a.moe_intermediate_size, b.moe_intermediate_size);
  field("tie_word_embeddings", a.tie_word_embeddings, b.tie_word_embeddings);
  if (problems.empty()) {
    std::map<std::string, const ModuleSpec*> serving;
    for (const ModuleSpec& m : current.modules) serving[m.name] = &m;
    for (const ModuleSpec& m : candidate.modules) {
      auto it = serving.find(m.name);
      if (it == serving.end())
        problems.push_back(m.name + ": not in the serving model");
      else if (it->second->shape != m.shape)
        problems.push_back(m.name + ": shape " + shape_string(m.shape) + " (serving " +
                           shape_string(it->second->shape) + ")");
      else if (it->second->quantized != m.quantized)
        problems.push_back(m.name + (m.quantized ? ": NVFP4 (serving BF16)" : ": BF16 (serving NVFP4)"));
      if (it != serving.end()) serving.erase(it);
    }
    for (const auto& [name, spec] : serving) problems.push_back(name + ": missing (the serving model has it)");
  }
  if (problems.empty()) return Status::ok();
  std::string message = "the new weights do not match the serving model's layout:";
  for (size_t i = 0; i < problems.size() && i < 10; ++i) message += "\n  " + problems[i];
  if (problems.size() > 10) message += "\n  ... and " + std::to_string(problems.size() - 10) + " more";
  return Status::error(message);
}

}  // namespace nibble::io
