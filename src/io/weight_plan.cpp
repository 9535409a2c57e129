// Module plan of Qwen3 / Qwen3-MoE / ERNIE-4.5-MoE checkpoints, names as in transformers'
// modeling_qwen3(_moe).py and modeling_ernie4_5_moe.py (experts stored per expert, as on disk).
#include "io/weight_plan.h"

#include <algorithm>
#include <cmath>

namespace nibble::io {
namespace {

void add_linear(std::vector<ModuleSpec>& out, const QuantConfig& quant, std::string name, ModuleRole role,
                int64_t out_features, int64_t in_features, int64_t layer, int64_t expert = -1) {
  const bool quantized = quant.is_quantized(name);
  out.push_back({std::move(name), role, ModuleKind::LINEAR, {out_features, in_features}, quantized, layer, expert});
  out.back().kv_scale = quant.kv_cache_fp8 && (role == ModuleRole::K_PROJ || role == ModuleRole::V_PROJ);
}

}  // namespace

const char* module_role_name(ModuleRole role) {
  static const char* NAMES[] = {"embedding",   "input_norm",  "q_proj",
                                "k_proj",      "v_proj",      "o_proj",
                                "q_norm",      "k_norm",      "post_attention_norm",
                                "router",      "expert_gate", "expert_up",
                                "expert_down", "mlp_gate",    "mlp_up",
                                "mlp_down",    "final_norm",  "lm_head",
                                "router_bias", "shared_gate", "shared_up",
                                "shared_down"};
  return NAMES[static_cast<int>(role)];
}

std::vector<TensorSpec> ModuleSpec::tensors() const {
  if (kind == ModuleKind::TENSOR) return {{name, dtype, shape}};
  std::vector<TensorSpec> t;
  if (kind != ModuleKind::LINEAR || !quantized) {
    t = {{name + ".weight", dtype, shape}};
  } else {
    const int64_t out = shape[0], in = shape[1];
    t = {{name + ".weight", DType::U8, {out, in / 2}},
         {name + ".weight_scale", DType::F8_E4M3, {out, in / 16}},
         {name + ".weight_scale_2", DType::F32, {}},
         {name + ".input_scale", DType::F32, {}}};
  }
  if (kv_scale) t.push_back({name + (role == ModuleRole::K_PROJ ? ".k_scale" : ".v_scale"), DType::F32, {}});
  return t;
}

uint64_t ModuleSpec::nbytes() const {
  uint64_t total = 0;
  for (const TensorSpec& t : tensors()) total += t.nbytes();
  return total;
}

std::vector<ModuleSpec> plan_modules(const ModelConfig& c, const QuantConfig& quant) {
  std::vector<ModuleSpec> m;
  const int64_t H = c.hidden_size, D = c.head_dim;
  m.push_back({"model.embed_tokens", ModuleRole::EMBEDDING, ModuleKind::EMBEDDING, {c.vocab_size, H}});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    m.push_back({p + "input_layernorm", ModuleRole::INPUT_NORM, ModuleKind::NORM, {H}, false, l});
    add_linear(m, quant, p + "self_attn.q_proj", ModuleRole::Q_PROJ, c.num_attention_heads * D, H, l);
    add_linear(m, quant, p + "self_attn.k_proj", ModuleRole::K_PROJ, c.num_key_value_heads * D, H, l);
    add_linear(m, quant, p + "self_attn.v_proj", ModuleRole::V_PROJ, c.num_key_value_heads * D, H, l);
    add_linear(m, quant, p + "self_attn.o_proj", ModuleRole::O_PROJ, H, c.num_attention_heads * D, l);
    if (c.qk_norm) {
      m.push_back({p + "self_attn.q_norm", ModuleRole::Q_NORM, ModuleKind::NORM, {D}, false, l});
      m.push_back({p + "self_attn.k_norm", ModuleRole::K_NORM, ModuleKind::NORM, {D}, false, l});
    }
    m.push_back({p + "post_attention_layernorm", ModuleRole::POST_ATTENTION_NORM, ModuleKind::NORM, {H}, false, l});
    if (c.is_moe_layer(l)) {
      add_linear(m, quant, p + "mlp.gate", ModuleRole::ROUTER, c.num_experts, H, l);
      if (c.router_fp32) m.back().dtype = DType::F32;
      if (c.router_score_bias)  // Ernie4_5_MoeStatics: [1, experts] fp32
        m.push_back({p + "mlp.moe_statics.e_score_correction_bias",
                     ModuleRole::ROUTER_BIAS,
                     ModuleKind::TENSOR,
                     {1, c.num_experts},
                     false,
                     l,
                     -1,
                     DType::F32});
      if (c.moe_num_shared_experts > 0) {
        const int64_t S = c.moe_intermediate_size * c.moe_num_shared_experts;
        add_linear(m, quant, p + "mlp.shared_experts.gate_proj", ModuleRole::SHARED_GATE, S, H, l);
        add_linear(m, quant, p + "mlp.shared_experts.up_proj", ModuleRole::SHARED_UP, S, H, l);
        add_linear(m, quant, p + "mlp.shared_experts.down_proj", ModuleRole::SHARED_DOWN, H, S, l);
      }
      for (int64_t e = 0; e < c.num_experts; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        add_linear(m, quant, x + "gate_proj", ModuleRole::EXPERT_GATE, c.moe_intermediate_size, H, l, e);
        add_linear(m, quant, x + "up_proj", ModuleRole::EXPERT_UP, c.moe_intermediate_size, H, l, e);
        add_linear(m, quant, x + "down_proj", ModuleRole::EXPERT_DOWN, H, c.moe_intermediate_size, l, e);
      }
    } else {
      add_linear(m, quant, p + "mlp.gate_proj", ModuleRole::MLP_GATE, c.intermediate_size, H, l);
      add_linear(m, quant, p + "mlp.up_proj", ModuleRole::MLP_UP, c.intermediate_size, H, l);
      add_linear(m, quant, p + "mlp.down_proj", ModuleRole::MLP_DOWN, H, c.intermediate_size, l);
    }
  }
  m.push_back({"model.norm", ModuleRole::FINAL_NORM, ModuleKind::NORM, {H}});
  if (!c.tie_word_embeddings) add_linear(m, quant, "lm_head", ModuleRole::LM_HEAD, c.vocab_size, H, -1);
  return m;
}

uint64_t bytes_per_decoded_token(const ModelConfig& c, const std::vector<ModuleSpec>& modules) {
  return bytes_per_decode_step(c, modules, 1);
}

uint64_t bytes_per_decode_step(const ModelConfig& c, const std::vector<ModuleSpec>& modules, int64_t sequences) {
  const double B = static_cast<double>(std::max<int64_t>(sequences, 1));
  const double k = static_cast<double>(c.num_experts_per_tok);
  const double E = static_cast<double>(std::max<int64_t>(c.num_experts, 1));
  const double touched = 1.0 - std::pow(1.0 - k / E, B);  // an expert's chance of being read
  double total = 0;
  for (const ModuleSpec& m : modules) {
    if (m.kind == ModuleKind::EMBEDDING) {
      total += B * static_cast<double>(m.nbytes()) / static_cast<double>(m.shape[0]);  // a row a token
      if (c.tie_word_embeddings) total += static_cast<double>(m.nbytes());             // it is the lm_head too
    } else if (m.expert >= 0) {
      // (One token: × k / E exactly, the bytes `nibble inspect` has always printed.)
      total += B == 1 ? static_cast<double>(m.nbytes()) * k / E : static_cast<double>(m.nbytes()) * touched;
    } else {
      total += static_cast<double>(m.nbytes());
    }
  }
  return static_cast<uint64_t>(total);
}

uint64_t parameter_count(const std::vector<ModuleSpec>& modules) {
  uint64_t n = 0;
  for (const ModuleSpec& m : modules) {
    uint64_t p = 1;
    for (int64_t d : m.shape) p *= static_cast<uint64_t>(d);
    n += p;
  }
  return n;
}

}  // namespace nibble::io
