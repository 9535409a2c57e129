// The tensors a checkpoint must hold for a ModelConfig + QuantConfig, module by module, with
// Hugging Face names 1:1. Used to bind a checkpoint (binding.h), to write one (synth) and to
// describe one (inspect). No model math here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/model_config.h"
#include "io/quant_config.h"
#include "io/safetensors.h"

namespace nibble::io {

// TENSOR: a bare parameter stored under the module's own name (ERNIE's e_score_correction_bias).
enum class ModuleKind { EMBEDDING, NORM, LINEAR, TENSOR };

// What a module does in the model, so no code has to derive it from the module's name.
enum class ModuleRole {
  EMBEDDING,
  INPUT_NORM,
  Q_PROJ,
  K_PROJ,
  V_PROJ,
  O_PROJ,
  Q_NORM,
  K_NORM,
  POST_ATTENTION_NORM,
  ROUTER,
  EXPERT_GATE,
  EXPERT_UP,
  EXPERT_DOWN,
  MLP_GATE,
  MLP_UP,
  MLP_DOWN,
  FINAL_NORM,
  LM_HEAD,
  ROUTER_BIAS,
  SHARED_GATE,
  SHARED_UP,
  SHARED_DOWN
};
const char* module_role_name(ModuleRole role);

struct ModuleSpec {
  std::string name;  // e.g. "model.layers.0.mlp.experts.3.up_proj"
  ModuleRole role = ModuleRole::EMBEDDING;
  ModuleKind kind = ModuleKind::LINEAR;
  std::vector<int64_t> shape;  // LINEAR [out, in]; NORM [n]; EMBEDDING [vocab, hidden]
  bool quantized = false;      // LINEAR only: NVFP4 as the quant config says
  int64_t layer = -1;          // decoder layer, -1 outside the layers
  int64_t expert = -1;         // expert index for MoE expert linears, else -1
  DType dtype = DType::BF16;   // the stored dtype when not NVFP4 (ERNIE's router and its bias: F32)
  bool kv_scale = false;       // k_proj / v_proj of a checkpoint with FP8 KV-cache scales (k_scale / v_scale)

  // The checkpoint tensors of this module: weight (TENSOR: the module name itself), and for NVFP4
  // linears weight_scale, weight_scale_2 and input_scale (docs/format.md); last, with kv_scale, the
  // fp32 scalar k_scale (k_proj) or v_scale (v_proj).
  std::vector<TensorSpec> tensors() const;
  uint64_t nbytes() const;
};

std::vector<ModuleSpec> plan_modules(const ModelConfig& config, const QuantConfig& quant);

// Bytes a decode step reads per token: every non-expert module, experts scaled by k/E (each token
// visits k of E experts per layer), one embedding row, and the lm_head.
uint64_t bytes_per_decoded_token(const ModelConfig& config, const std::vector<ModuleSpec>& modules);
// The weight bytes a decode step of `sequences` tokens reads at even expert loads: every non-expert
// module once, each expert with the chance that one of the tokens picks it (1 − (1 − k/E)^B, for
// independent uniform picks; skewed routing touches fewer), an embedding row a token, the lm_head
// once. One sequence is bytes_per_decoded_token.
uint64_t bytes_per_decode_step(const ModelConfig& config, const std::vector<ModuleSpec>& modules, int64_t sequences);
uint64_t parameter_count(const std::vector<ModuleSpec>& modules);

}  // namespace nibble::io
