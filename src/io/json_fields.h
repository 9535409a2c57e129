// JsonFields: typed, range-checked reads of a JSON object's fields that collect every problem into
// one error ("config.json: 'hidden_size' must be an integer in [16, 1048576]; missing 'vocab_size'").
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace nibble::io {

class JsonFields {
 public:
  JsonFields(const nlohmann::json& object, std::string path) : object_(object), path_(std::move(path)) {}

  void integer(const char* key, int64_t& out, int64_t min, int64_t max, bool required);
  void real(const char* key, double& out, double min, double max, bool required);
  void boolean(const char* key, bool& out, bool required);
  void string(const char* key, std::string& out, bool required);
  void string_list(const char* key, std::vector<std::string>& out, bool required);
  void integer_list(const char* key, std::vector<int64_t>& out, bool required);

  void fail(const std::string& problem) { problems_.push_back(problem); }
  bool ok() const { return problems_.empty(); }
  std::string error() const;  // "path: problem; problem"

 private:
  const nlohmann::json* field(const char* key, bool required);
  const nlohmann::json& object_;
  std::string path_;
  std::vector<std::string> problems_;
};

}  // namespace nibble::io
