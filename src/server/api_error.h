// Errors as OpenAI clients expect them: {"error": {"message", "type", "param", "code"}} with the
// HTTP status (vLLM's ErrorResponse shape); one helper reads typed request fields and stops at the
// first problem, naming the field.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace nibble::server {

using json = nlohmann::json;

struct ApiError {
  int status = 400;
  std::string message;
  std::string param;  // the offending field, if one
};

std::string error_body(const ApiError& error);
// JSON text for the wire: invalid UTF-8 (a token that is half a character) becomes U+FFFD.
std::string dump(const json& j);

// Reads optional fields of a request object; the first wrong one becomes `error`.
class RequestFields {
 public:
  explicit RequestFields(const json& body) : body_(body) {}
  bool has(const char* key) const { return body_.contains(key) && !body_[key].is_null(); }
  const json& at(const char* key) const { return body_[key]; }

  bool integer(const char* key, int64_t& out, int64_t lo, int64_t hi);
  bool number(const char* key, double& out, double lo, double hi);
  bool number(const char* key, float& out, double lo, double hi);
  bool boolean(const char* key, bool& out);
  bool string(const char* key, std::string& out);
  // A string or a list of strings ("stop").
  bool strings(const char* key, std::vector<std::string>& out);
  bool integers(const char* key, std::vector<int32_t>& out, int64_t lo, int64_t hi);
  bool fail(const char* key, const std::string& why);

  std::optional<ApiError> error;

 private:
  const json& body_;
};

}  // namespace nibble::server
