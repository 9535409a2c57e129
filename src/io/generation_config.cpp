// generation_config.json reader. do_sample = false means greedy, so temperature 0 then.
#include "io/generation_config.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/json_fields.h"

namespace nibble::io {

Result<GenerationConfig> load_generation_config(const std::string& model_dir) {
  const std::string path = (std::filesystem::path(model_dir) / "generation_config.json").string();
  GenerationConfig out;
  std::ifstream file(path);
  if (!file) return out;
  std::stringstream text;
  text << file.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::error(path + ": not a JSON object");
  JsonFields f(j, path);
  auto real = [&](const char* key, std::optional<double>& slot, double lo, double hi) {
    if (!j.contains(key) || j[key].is_null()) return;
    double v = 0;
    f.real(key, v, lo, hi, true);
    slot = v;
  };
  real("temperature", out.temperature, 0.0, 100.0);
  real("top_p", out.top_p, 0.0, 1.0);
  real("min_p", out.min_p, 0.0, 1.0);
  real("repetition_penalty", out.repetition_penalty, 0.0, 1e4);
  auto integer = [&](const char* key, std::optional<int64_t>& slot) {
    if (!j.contains(key) || j[key].is_null()) return;
    int64_t v = 0;
    f.integer(key, v, -1, int64_t{1} << 40, true);
    slot = v;
  };
  integer("top_k", out.top_k);
  integer("max_new_tokens", out.max_new_tokens);
  if (j.contains("eos_token_id") && !j["eos_token_id"].is_null()) {
    if (j["eos_token_id"].is_array())
      f.integer_list("eos_token_id", out.eos_token_ids, true);
    else {
      int64_t v = 0;
      f.integer("eos_token_id", v, 0, int64_t{1} << 31, true);
      out.eos_token_ids = {v};
    }
  }
  if (j.contains("do_sample") && j["do_sample"].is_boolean() && !j["do_sample"].get<bool>()) out.temperature = 0.0;
  if (!f.ok()) return Status::error(f.error());
  return out;
}

}  // namespace nibble::io
