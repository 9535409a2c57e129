// QuantConfig: which modules of a ModelOpt checkpoint are NVFP4, read from hf_quant_config.json or
// config.json["quantization_config"] (quant_method "modelopt"). A folder with neither is BF16.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace nibble::io {

struct QuantConfig {
  bool nvfp4 = false;    // false: an unquantized (BF16) checkpoint
  std::string source;    // the file it came from, for messages
  std::string producer;  // e.g. "modelopt 0.29.0"
  int group_size = 16;
  std::vector<std::string> exclude_modules;  // fnmatch patterns of modules left unquantized
  // kv_cache_quant_algo "FP8": k_proj and v_proj carry calibrated scales (k_scale, v_scale: amax /
  // 448), which an FP8 KV cache (--kv-cache-dtype fp8) stores K / k_scale and V / v_scale with.
  bool kv_cache_fp8 = false;

  // True when `module` (e.g. "model.layers.0.mlp.gate") stays unquantized.
  bool is_excluded(std::string_view module) const;
  bool is_quantized(std::string_view module) const { return nvfp4 && !is_excluded(module); }
};

// fnmatch (Python fnmatch.fnmatchcase: *, ?, [seq], [!seq]) with ModelOpt's prefix rule: a pattern
// ending in '*' right after a name character, like "lm_head*", matches the module itself and its
// children ("lm_head", "lm_head.x"), not siblings that merely share the prefix ("lm_head_2").
bool module_pattern_matches(std::string_view pattern, std::string_view module);

// Reads the quantization config of a model folder (config_json_text is config.json's content).
Result<QuantConfig> load_quant_config(const std::string& model_dir, const std::string& config_json_text);

}  // namespace nibble::io
