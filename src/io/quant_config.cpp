// Quantization config of ModelOpt exports. Formats: hf_quant_config.json
// {"producer":{...},"quantization":{"quant_algo","kv_cache_quant_algo","group_size","exclude_modules"}}
// and config.json quantization_config {"quant_method":"modelopt","quant_algo","ignore",
// "config_groups":{"group_0":{"weights":{"group_size":16,...}}},"kv_cache_scheme"?}
// (nvidia-modelopt 0.47 modelopt/torch/export/convert_hf_config.py).
#include "io/quant_config.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/json_fields.h"

namespace nibble::io {
namespace {

using json = nlohmann::json;

bool fnmatch(std::string_view p, std::string_view s) {
  size_t pi = 0, si = 0, star_p = std::string_view::npos, star_s = 0;
  while (si < s.size()) {
    if (pi < p.size() && p[pi] == '*') {
      star_p = pi++;
      star_s = si;
      continue;
    }
    bool matched = false;
    size_t next_pi = pi + 1;
    if (pi < p.size() && p[pi] == '?') {
      matched = true;
    } else if (pi < p.size() && p[pi] == '[') {
      size_t j = pi + 1;
      const bool negate = j < p.size() && p[j] == '!';
      if (negate) ++j;
      bool in_set = false;
      const size_t set_start = j;
      while (j < p.size() && (p[j] != ']' || j == set_start)) {
        if (j + 2 < p.size() && p[j + 1] == '-' && p[j + 2] != ']') {
          in_set |= p[j] <= s[si] && s[si] <= p[j + 2];
          j += 3;
        } else {
          in_set |= p[j] == s[si];
          ++j;
        }
      }
      if (j < p.size()) {  // a closed set; an unclosed '[' is a literal, as in Python
        matched = in_set != negate;
        next_pi = j + 1;
      } else {
        matched = s[si] == '[';
      }
    } else if (pi < p.size()) {
      matched = p[pi] == s[si];
    }
    if (matched) {
      pi = next_pi;
      ++si;
    } else if (star_p != std::string_view::npos) {
      pi = star_p + 1;
      si = ++star_s;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

Result<std::string> read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::error(path + ": cannot open");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// quant_algo must be NVFP4; the KV cache's quantization none or FP8 (hf_quant_config.json's
// kv_cache_quant_algo "FP8", or config.json's kv_cache_scheme {"type": "float", "num_bits": 8}).
Status check_algorithms(const std::string& where, const json& quant_algo, const json& kv_cache, bool& kv_fp8) {
  if (!quant_algo.is_string()) return Status::error(where + ": 'quant_algo' must be a string");
  if (quant_algo.get<std::string>() != "NVFP4") {
    return Status::error(where + ": quant_algo '" + quant_algo.get<std::string>() +
                         "' is not supported yet (nibble runs NVFP4 checkpoints)");
  }
  kv_fp8 =
      (kv_cache.is_string() && kv_cache.get<std::string>() == "FP8") ||
      (kv_cache.is_object() && kv_cache.value("type", json()) == "float" && kv_cache.value("num_bits", json()) == 8);
  if (!kv_cache.is_null() && !kv_fp8) {
    return Status::error(where + ": KV-cache quantization (" + kv_cache.dump() +
                         ") is not supported (FP8 only: its scales serve --kv-cache-dtype fp8)");
  }
  return Status::ok();
}

}  // namespace

bool module_pattern_matches(std::string_view pattern, std::string_view module) {
  if (pattern.size() >= 2 && pattern.back() == '*' && pattern[pattern.size() - 2] != '*' &&
      pattern[pattern.size() - 2] != '.') {
    const std::string stem(pattern.substr(0, pattern.size() - 1));
    return fnmatch(stem, module) || fnmatch(stem + ".*", module);
  }
  return fnmatch(pattern, module);
}

bool QuantConfig::is_excluded(std::string_view module) const {
  for (const std::string& pattern : exclude_modules)
    if (module_pattern_matches(pattern, module)) return true;
  return false;
}

namespace {

Result<QuantConfig> load_quant_config_unchecked(const std::string& model_dir, const std::string& config_json_text) {
  QuantConfig q;
  const std::string hf_path = model_dir + "/hf_quant_config.json";
  if (std::filesystem::exists(hf_path)) {
    Result<std::string> text = read_text(hf_path);
    if (!text) return text.status();
    const json root = json::parse(*text, nullptr, false);
    if (root.is_discarded() || !root.is_object() || !root.contains("quantization") || !root["quantization"].is_object())
      return Status::error(hf_path + ": needs an object 'quantization'");
    const json& quant = root["quantization"];
    NIB_RETURN_IF_ERROR(check_algorithms(hf_path, quant.value("quant_algo", json()),
                                         quant.value("kv_cache_quant_algo", json()), q.kv_cache_fp8));
    JsonFields f(quant, hf_path);
    int64_t group_size = 16;
    f.integer("group_size", group_size, 1, 1024, false);
    f.string_list("exclude_modules", q.exclude_modules, false);
    if (!f.ok()) return Status::error(f.error());
    q.group_size = static_cast<int>(group_size);
    if (root.contains("producer") && root["producer"].is_object())
      q.producer = root["producer"].value("name", "") + " " + root["producer"].value("version", "");
    q.source = hf_path;
  } else {
    const json config = json::parse(config_json_text, nullptr, false);
    if (config.is_discarded() || !config.is_object() || !config.contains("quantization_config") ||
        config["quantization_config"].is_null()) {
      return q;  // unquantized checkpoint
    }
    const std::string where = model_dir + "/config.json: quantization_config";
    const json& quant = config["quantization_config"];
    if (!quant.is_object()) return Status::error(where + " must be an object");
    const std::string method = quant.value("quant_method", "");
    if (method != "modelopt") {
      return Status::error(where + ": quant_method '" + method +
                           "' is not supported yet (nibble reads ModelOpt checkpoints)");
    }
    NIB_RETURN_IF_ERROR(check_algorithms(where, quant.value("quant_algo", json()),
                                         quant.value("kv_cache_scheme", json()), q.kv_cache_fp8));
    JsonFields f(quant, where);
    f.string_list("ignore", q.exclude_modules, false);
    if (!f.ok()) return Status::error(f.error());
    if (quant.contains("config_groups") && quant["config_groups"].is_object()) {
      for (const auto& [name, group] : quant["config_groups"].items()) {
        if (group.is_object() && group.contains("weights") && group["weights"].is_object() &&
            group["weights"].contains("group_size")) {
          if (!group["weights"]["group_size"].is_number_integer())
            return Status::error(where + ": config_groups." + name + ".weights.group_size must be an integer");
          q.group_size = group["weights"]["group_size"].get<int>();
        }
      }
    }
    if (quant.contains("producer") && quant["producer"].is_object())
      q.producer = quant["producer"].value("name", "") + " " + quant["producer"].value("version", "");
    q.source = model_dir + "/config.json";
  }
  if (q.group_size != 16) {
    return Status::error(q.source + ": NVFP4 group_size " + std::to_string(q.group_size) +
                         " is not supported (NVFP4 blocks are 16 elements)");
  }
  q.nvfp4 = true;
  return q;
}

}  // namespace

Result<QuantConfig> load_quant_config(const std::string& model_dir, const std::string& config_json_text) {
  try {  // fields of unexpected JSON types throw in nlohmann's accessors
    return load_quant_config_unchecked(model_dir, config_json_text);
  } catch (const nlohmann::json::exception& e) {
    return Status::error(model_dir + ": quantization config: " + e.what());
  }
}

}  // namespace nibble::io
