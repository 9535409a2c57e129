// JsonFields: see json_fields.h. null counts as absent, as in Hugging Face configs.
#include "io/json_fields.h"

namespace nibble::io {

const nlohmann::json* JsonFields::field(const char* key, bool required) {
  auto it = object_.find(key);
  if (it == object_.end() || it->is_null()) {
    if (required) fail(std::string("missing '") + key + "'");
    return nullptr;
  }
  return &*it;
}

void JsonFields::integer(const char* key, int64_t& out, int64_t min, int64_t max, bool required) {
  const nlohmann::json* v = field(key, required);
  if (!v) return;
  if (!v->is_number_integer() || v->get<int64_t>() < min || v->get<int64_t>() > max) {
    fail(std::string("'") + key + "' must be an integer in [" + std::to_string(min) + ", " + std::to_string(max) +
         "], got " + v->dump());
    return;
  }
  out = v->get<int64_t>();
}

void JsonFields::real(const char* key, double& out, double min, double max, bool required) {
  const nlohmann::json* v = field(key, required);
  if (!v) return;
  if (!v->is_number() || v->get<double>() < min || v->get<double>() > max) {
    fail(std::string("'") + key + "' must be a number in [" + std::to_string(min) + ", " + std::to_string(max) +
         "], got " + v->dump());
    return;
  }
  out = v->get<double>();
}

void JsonFields::boolean(const char* key, bool& out, bool required) {
  const nlohmann::json* v = field(key, required);
  if (!v) return;
  if (!v->is_boolean()) return fail(std::string("'") + key + "' must be true or false, got " + v->dump());
  out = v->get<bool>();
}

void JsonFields::string(const char* key, std::string& out, bool required) {
  const nlohmann::json* v = field(key, required);
  if (!v) return;
  if (!v->is_string()) return fail(std::string("'") + key + "' must be a string, got " + v->dump());
  out = v->get<std::string>();
}

void JsonFields::string_list(const char* key, std::vector<std::string>& out, bool required) {
  const nlohmann::json* v = field(key, required);
  if (!v) return;
  std::vector<std::string> values;
  bool valid = v->is_array();
  for (const auto& item : valid ? *v : nlohmann::json::array()) {
    if (!item.is_string())
      valid = false;
    else
      values.push_back(item.get<std::string>());
  }
  if (!valid) return fail(std::string("'") + key + "' must be a list of strings");
  out = std::move(values);
}

void JsonFields::integer_list(const char* key, std::vector<int64_t>& out, bool required) {
  const nlohmann::json* v = field(key, required);
  if (!v) return;
  std::vector<int64_t> values;
  bool valid = v->is_array();
  for (const auto& item : valid ? *v : nlohmann::json::array()) {
    if (!item.is_number_integer())
      valid = false;
    else
      values.push_back(item.get<int64_t>());
  }
  if (!valid) return fail(std::string("'") + key + "' must be a list of integers");
  out = std::move(values);
}

std::string JsonFields::error() const {
  std::string message = path_ + ": ";
  for (size_t i = 0; i < problems_.size(); ++i) message += (i ? "; " : "") + problems_[i];
  return message;
}

}  // namespace nibble::io
